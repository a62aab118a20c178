"""LM data: tokenize once into a memory-mapped array, split by position or by document, random windows that
resume exactly."""

import json

import numpy as np
import pytest
import torch

from qkv.errors import ConfigError, DataError
from qkv.data.lm import (LMData, load_splits, load_tokens, split_by_position, split_documents, split_text, token_dtype,
                         tokenize_to_file)
from qkv.tokenizers.char import CharTokenizer
from qkv.recipes import LMDataConfig

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20


def test_dtype_is_the_smallest_that_holds_every_id():
    assert token_dtype(65) == np.uint16
    assert token_dtype(65536) == np.uint16  # ids 0..65535
    assert token_dtype(65537) == np.uint32


def test_tokenize_once_then_reuse_and_rebuild_when_the_text_changes(tmp_path):
    tok = CharTokenizer.train(TEXT)
    path = tmp_path / "tokens.bin"
    arr = tokenize_to_file(TEXT, tok, path, "char-v1")
    assert isinstance(arr, np.memmap) and arr.dtype == np.uint16
    assert arr.tolist() == tok.encode(TEXT)
    assert path.stat().st_size == 2 * len(TEXT)

    class Counting:  # the same tokenizer, counting calls to encode
        vocab_size = tok.vocab_size
        calls = 0

        def encode(self, text):
            Counting.calls += 1
            return tok.encode(text)

    tokenize_to_file(TEXT, Counting(), path, "char-v1")
    assert Counting.calls == 0  # reused
    changed = tokenize_to_file(TEXT[:-5], Counting(), path, "char-v1")
    assert Counting.calls == 1 and len(changed) == len(TEXT) - 5
    tokenize_to_file(TEXT[:-5], Counting(), path, "char-v2")  # another tokenizer: rebuilt
    assert Counting.calls == 2
    assert json.loads((tmp_path / "tokens.bin.json").read_text())["length"] == len(TEXT) - 5


def test_a_truncated_token_file_is_refused(tmp_path):
    tok = CharTokenizer.train(TEXT)
    path = tmp_path / "tokens.bin"
    tokenize_to_file(TEXT, tok, path)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="truncated"):
        load_tokens(path)


def test_a_damaged_sidecar_names_its_file_and_the_cure(tmp_path):
    tok = CharTokenizer.train(TEXT)
    path = tmp_path / "tokens.bin"
    tokenize_to_file(TEXT, tok, path)
    (tmp_path / "tokens.bin.json").write_text('{"fingerprint": ', encoding="utf-8")  # cut by a crash of another tool
    with pytest.raises(DataError, match=r"tokens.bin.json:1: not valid JSON .*qkv train lm --resume"):
        load_splits(path)
    assert tokenize_to_file(TEXT, tok, path).tolist() == tok.encode(TEXT)  # what the resume does: written again


def test_split_by_position_first_90_last_10():
    tokens = np.arange(1000)
    train, valid = split_by_position(tokens, 0.1)
    assert len(train) == 900 and train[-1] == 899 and valid[0] == 900 and valid[-1] == 999
    with pytest.raises(ValueError, match="valid_fraction"):
        split_by_position(tokens, 1.0)


def test_windows_are_contiguous_shifted_and_stay_inside_their_split():
    tokens = np.arange(1000, dtype=np.uint16)
    data = LMData.from_tokens(tokens, 0.1, seed=3)
    for _ in range(20):
        x, y = data.get_batch("valid", 8, 16)
        assert x.shape == y.shape == (8, 16) and x.dtype == torch.int64
        assert torch.equal(y[:, :-1], x[:, 1:])
        assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=torch.long))  # consecutive ids
        assert int(x.min()) >= 900 and int(y.max()) <= 999
        x, _ = data.get_batch("train", 8, 16)
        assert int(x.max()) < 900 - 1


def test_the_sampler_state_resumes_the_same_windows():
    data = LMData.from_tokens(np.arange(5000), 0.1, seed=0)
    data.get_batch("train", 4, 8)
    state = data.state_dict()
    expected = [data.get_batch("train", 4, 8)[0] for _ in range(3)]
    other = LMData.from_tokens(np.arange(5000), 0.1, seed=99)
    other.load_state_dict(state)
    assert all(torch.equal(a, other.get_batch("train", 4, 8)[0]) for a in expected)


def test_a_split_shorter_than_the_context_is_a_clear_error():
    data = LMData.from_tokens(np.arange(100), 0.1)
    with pytest.raises(ValueError, match="valid split has 10 tokens"):
        data.check_context(16)


def _poems(numbers) -> str:
    return "".join(f"poem {i}\nits line {i}\n\n" for i in numbers)


def test_every_tenth_document_is_held_out_whole():
    train, valid = split_documents(_poems(range(30)), 0.1)
    assert valid == _poems([9, 19, 29])  # spread over the corpus, not its end
    assert train == _poems(i for i in range(30) if i % 10 != 9)
    assert split_documents(_poems(range(30)), 0.25)[1] == _poems([3, 7, 11, 15, 19, 23, 27])  # floor(30 / 4)


def test_documents_are_cut_at_any_blank_line_and_end_with_one():
    train, valid = split_documents("a\nb\n\n\n\nc\n \t\nd\n\ne", 0.5)  # runs of blank lines, blanks in them, no end
    assert (train, valid) == ("a\nb\n\nd\n\n", "c\n\ne\n\n")


def test_too_few_documents_to_hold_any_out_is_a_clear_error():
    with pytest.raises(ValueError, match="2 document.*data.split=position"):
        split_documents("one poem\n\nanother\n", 0.1)


def test_held_out_documents_are_tokenized_after_the_rest_and_split_where_they_start(tmp_path):
    text = _poems(range(30))
    tok = CharTokenizer.train(text)
    path = tmp_path / "tokens.bin"
    train_text, valid_text = split_text(text, "documents", 0.1)
    tokenize_to_file(train_text, tok, path, "char-v1", valid_text)
    assert json.loads((tmp_path / "tokens.bin.json").read_text())["valid_start"] == len(train_text)
    train, valid = load_splits(path, 0.1)
    assert train.tolist() == tok.encode(train_text) and valid.tolist() == tok.encode(valid_text)
    assert LMData.from_file(path, 0.1).valid.tolist() == tok.encode(valid_text)

    assert split_text(text, "position", 0.1) == (text, None)  # by position: the whole text, cut as tokens
    tokenize_to_file(text, tok, path, "char-v1")  # another split of the same text: tokenized again
    assert "valid_start" not in json.loads((tmp_path / "tokens.bin.json").read_text())
    train, valid = load_splits(path, 0.1)
    assert len(train) == int(0.9 * len(text)) and train.tolist() + valid.tolist() == tok.encode(text)


def test_a_split_that_does_not_exist_is_a_config_error():
    with pytest.raises(ConfigError, match="data.split must be one of position, documents, got 'document'"):
        LMDataConfig(split="document")
    with pytest.raises(ConfigError, match="data.valid_fraction"):
        LMDataConfig(valid_fraction=0)
