"""Character-level tokenizer: exact round trips, fixed special ids, unknown characters, save/load."""

from __future__ import annotations

import json

import pytest

from qkv.tokenizers import CharTokenizer, TokenizerError, load_tokenizer


def test_round_trip_and_sorted_vocabulary(texts):
    tok = CharTokenizer.train(texts)
    for t in texts:
        ids = tok.encode(t)
        assert len(ids) == len(t)
        assert tok.decode(ids) == t
    alphabet = sorted(set("".join(texts)))
    assert tok.vocab_size == 4 + len(alphabet)
    assert [tok.id_to_token(i) for i in range(tok.vocab_size)] == ["<pad>", "<bos>", "<eos>", "<unk>"] + alphabet


def test_special_ids_are_fixed(texts):
    tok = CharTokenizer.train(texts)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    ids = tok.encode("小明", add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 4
    assert tok.decode(ids) == "小明"
    assert tok.decode(ids, skip_special=False) == "<bos>小明<eos>"
    assert tok.decode([0, 0] + ids[1:-1]) == "小明"


def test_without_specials_like_nanogpt():
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    tok = CharTokenizer.train(text, specials=False)
    assert tok.vocab_size == len(set(text))
    assert tok.encode("\n") == [0]  # "\n" sorts first, as in nanoGPT's 65-character vocabulary
    assert tok.pad_id is None and tok.unk_id is None
    with pytest.raises(TokenizerError, match=r"'Z' \(U\+005A\) at position 2 is not in the vocabulary"):
        tok.encode("FiZ")
    with pytest.raises(TokenizerError, match="needs specials"):
        CharTokenizer(["a"], specials=False, on_unknown="unk")


def test_unknown_characters(texts):
    tok = CharTokenizer.train(texts)
    ids = tok.encode("小明😀ж")
    assert ids[2:] == [tok.unk_id, tok.unk_id]
    assert tok.decode(ids) == "小明<unk><unk>"
    strict = CharTokenizer.train(texts, on_unknown="error")
    with pytest.raises(TokenizerError, match="U\\+1F600"):
        strict.encode("小明😀")


def test_save_load(tmp_path, texts):
    tok = CharTokenizer.train(texts, specials=False)
    path = tok.save(tmp_path / "tok")
    assert path.name == "tokenizer.json"
    assert json.loads(path.read_text(encoding="utf-8"))["qkv_tokenizer"] == "char"
    for loaded in (CharTokenizer.load(tmp_path / "tok"), load_tokenizer(tmp_path / "tok"), load_tokenizer(path)):
        assert isinstance(loaded, CharTokenizer) and loaded == tok
        assert loaded.encode(texts[4]) == tok.encode(texts[4])
    assert CharTokenizer.train(texts) != tok  # with specials: different ids


def test_bad_inputs(tmp_path):
    with pytest.raises(TokenizerError, match="repeated"):
        CharTokenizer(["a", "b", "a"])
    with pytest.raises(TokenizerError, match="single characters"):
        CharTokenizer(["ab"])
    tok = CharTokenizer(["a"])
    with pytest.raises(TokenizerError, match="token id 9 is outside the vocabulary"):
        tok.decode([9])
    (tmp_path / "tokenizer.json").write_text('{"qkv_tokenizer": "char", "chars": ["a"]}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="missing key 'specials'"):
        load_tokenizer(tmp_path)


def test_decode_accepts_tensors(texts):
    torch = pytest.importorskip("torch")
    tok = CharTokenizer.train(texts)
    assert tok.decode(torch.tensor(tok.encode("你好"))) == "你好"
    with pytest.raises(TokenizerError, match="decode_batch"):
        tok.decode(torch.tensor([tok.encode("你好")]))
