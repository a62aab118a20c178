"""BPE tokenizers: exact round trips without word segmentation, fixed special ids, unseen characters."""

from __future__ import annotations

import json
import unicodedata

import pytest

from qkv.data.synthetic import demo_corpus
from qkv.tokenizers import BPETokenizer, TokenizerError, load_tokenizer


@pytest.fixture(scope="module")
def training_text(texts):
    zh, en = demo_corpus(seed=0, n_train=2000, n_valid=5, n_test=5)["train"]
    return list(texts) * 20 + zh + en


@pytest.fixture(scope="module")
def bpe(training_text):
    return BPETokenizer.train(training_text, vocab_size=400)


@pytest.fixture(scope="module")
def bytelevel(training_text):
    return BPETokenizer.train(training_text, vocab_size=400, kind="bytelevel")


def test_special_ids_are_fixed(bpe, bytelevel):
    for tok in (bpe, bytelevel):
        assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
        assert [tok.id_to_token(i) for i in range(4)] == ["<pad>", "<bos>", "<eos>", "<unk>"]
        ids = tok.encode("小明累了", add_bos=True, add_eos=True)
        assert ids[0] == 1 and ids[-1] == 2 and 3 not in ids
        assert tok.decode(ids) == "小明累了"
        assert tok.decode([0, 0] + ids + [0]) == "小明累了"
        assert tok.decode(ids, skip_special=False).startswith("<bos>")


def test_round_trip_english_german_chinese_mixed(bpe, bytelevel, texts):
    for tok in (bpe, bytelevel):
        for t in texts:
            ids = tok.encode(t)
            assert tok.unk_id not in ids, (tok.kind, t)
            assert tok.decode(ids) == t, (tok.kind, t)


def test_chinese_is_split_into_subwords_not_one_token_per_sentence(bpe):
    # No pre-segmentation: BPE merges characters into words, and punctuation is cut off.
    pieces = bpe.tokens("小明累了，他想睡觉。")
    assert "".join(pieces) == "小明累了，他想睡觉。"
    assert "，" in pieces and "。" in pieces and "小明" in pieces
    assert pieces.index("，") > 0 and len(pieces) < 10
    assert bpe.tokens("Xiaoming is tired, he wants to sleep.")[:3] == ["Xiaoming", " is", " tired"]


def test_merges_make_sequences_shorter_than_characters(bpe, bytelevel):
    s = "Xiaoming is tired, he wants to sleep."
    assert len(bpe.encode(s)) < len(s) / 2
    assert len(bytelevel.encode(s)) < len(s) / 2


def test_nfc_normalization(bpe):
    decomposed = unicodedata.normalize("NFD", "Mädchen über Straße")
    assert decomposed != "Mädchen über Straße"
    assert bpe.decode(bpe.encode(decomposed)) == "Mädchen über Straße"


def test_unseen_characters_do_not_crash(bpe, bytelevel):
    text = "Ж 😀 ǅ"
    ids = bpe.encode(text)
    assert bpe.unk_id in ids
    assert bpe.decode(ids) == "<unk> <unk> <unk>"
    ids = bytelevel.encode(text)
    assert bytelevel.unk_id not in ids  # byte-level: nothing is ever unknown
    assert bytelevel.decode(ids) == text


def test_encode_batch_matches_encode(bpe, texts):
    assert bpe.encode_batch(texts, add_eos=True) == [bpe.encode(t, add_eos=True) for t in texts]
    assert bpe.decode_batch(bpe.encode_batch(texts)) == list(texts)


def test_save_load(tmp_path, bpe, bytelevel, texts):
    for tok in (bpe, bytelevel):
        path = tok.save(tmp_path / tok.kind)
        assert path.name == "tokenizer.json" and "model" in json.loads(path.read_text(encoding="utf-8"))
        loaded = load_tokenizer(tmp_path / tok.kind)
        assert isinstance(loaded, BPETokenizer) and loaded == tok and loaded.kind == tok.kind
        assert loaded.vocab_size == tok.vocab_size
        assert [loaded.encode(t) for t in texts] == [tok.encode(t) for t in texts]
    assert bpe != bytelevel


def test_vocab_size_and_bad_ids(bpe):
    assert bpe.vocab_size == len(bpe) == 400
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        bpe.decode([400])
    with pytest.raises(TokenizerError, match="kind must be one of"):
        BPETokenizer.train(["abc"], 100, kind="wordpiece")
    with pytest.raises(TokenizerError, match="must exceed"):
        BPETokenizer.train(["abc"], 4)


def test_load_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer at"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "nonsense"}}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a `tokenizers` file"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a JSON"):
        load_tokenizer(tmp_path)


def test_the_library_is_imported_lazily():
    # `import qkv.tokenizers` must not pay for (or need) the `tokenizers` library: no module-level import.
    import ast
    import inspect

    import qkv.tokenizers
    import qkv.tokenizers.bpe
    import qkv.tokenizers.char

    for module in (qkv.tokenizers, qkv.tokenizers.bpe, qkv.tokenizers.char):
        for node in ast.parse(inspect.getsource(module)).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n and n.split(".")[0] == "tokenizers" for n in names), module.__name__


def test_lone_surrogates_become_the_replacement_character(bpe):
    """JSON escapes and surrogateescape can give a str that UTF-8 cannot hold: encoded as U+FFFD, not a crash."""
    assert bpe.encode("a\ud800b") == bpe.encode("a\ufffdb")
    assert bpe.encode_batch(["\udc80x", "ok"]) == [bpe.encode("\ufffdx"), bpe.encode("ok")]
    assert bpe.encode("\U0001F600") == bpe.encode("\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16"))


def test_a_lexicon_keeps_its_words_apart(tmp_path):
    """With words=, no merge joins two words written without a space; the boundaries survive saving."""
    texts = ["他想睡觉。", "她想回家。", "他想回家。"] * 20
    plain = BPETokenizer.train(texts, vocab_size=40)
    assert plain.id_to_token(plain.encode("他想睡觉。")[0]).startswith("他想")  # merged without a lexicon
    kept = BPETokenizer.train(texts, vocab_size=40, words=["他", "她", "想", "睡觉", "回家"])
    tokens = [kept.id_to_token(i) for i in kept.encode("他想睡觉。")]
    assert tokens == ["他", "想", "睡觉", "。"]
    kept.save(tmp_path)
    again = BPETokenizer.load(tmp_path / "tokenizer.json")
    assert again.encode("他想睡觉。") == kept.encode("他想睡觉。")
    assert again.decode(again.encode("他想睡觉。")) == "他想睡觉。"
    with pytest.raises(TokenizerError, match="kind='bpe' only"):
        BPETokenizer.train(texts, vocab_size=300, kind="bytelevel", words=["他"])
