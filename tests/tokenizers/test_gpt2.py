"""GPT-2's tokenizer (tiktoken) behind qkv's tokenizer interface, and runs converted from GPT-2.

GPT-2's real merges are downloaded by tiktoken, and tests run without a network: they use a small
BPE with GPT-2's pre-tokenizing regex and its ``<|endoftext|>`` token instead. What the wrapper adds
(ids of special tokens, saving the merges into a run, loading offline, errors) is the same either way.
"""

import json

import pytest
import torch

pytest.importorskip("tiktoken")
from tiktoken_ext.openai_public import r50k_pat_str  # noqa: E402

import qkv.cli  # noqa: E402
from qkv.tokenizers import TokenizerError, load_tokenizer  # noqa: E402
from qkv.tokenizers.gpt2 import ENDOFTEXT, GPT2Tokenizer  # noqa: E402


def small_gpt2_like() -> GPT2Tokenizer:
    ranks = {bytes([i]): i for i in range(256)}
    for token in (b"th", b"the", b" t", b" the", b"er", b"in", b"ing"):
        ranks[token] = len(ranks)
    return GPT2Tokenizer({"name": "gpt2-small-test", "pat_str": r50k_pat_str, "mergeable_ranks": ranks,
                          "special_tokens": {ENDOFTEXT: len(ranks)}})


def test_round_trip_special_ids_and_endoftext_written_as_text():
    tok = small_gpt2_like()
    assert tok.vocab_size == 264 and tok.eos_id == tok.bos_id == 263
    assert tok.pad_id is None and tok.unk_id is None
    for text in ["the thing in there", "小明累了，他想睡觉。", "emoji 🙂 and tabs\t\n", ""]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("the")[-1] == 257  # merged: one token
    ids = tok.encode("the", add_bos=True, add_eos=True)
    assert ids[0] == ids[-1] == tok.eos_id
    assert tok.decode(ids) == "the" and tok.decode(ids, skip_special=False) == f"{ENDOFTEXT}the{ENDOFTEXT}"
    # A user's text that spells the special token is text, never the control token.
    assert tok.eos_id not in tok.encode(f"a{ENDOFTEXT}b")
    assert tok.encode_batch(["the", "in"]) == [tok.encode("the"), tok.encode("in")]
    assert tok.id_to_token(257) == "the"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([264])


def test_saved_into_a_run_it_loads_offline_with_the_same_ids(tmp_path):
    tok = small_gpt2_like()
    tok.save(tmp_path)
    assert (tmp_path / "tokenizer.bpe").is_file()
    again = load_tokenizer(tmp_path)
    assert isinstance(again, GPT2Tokenizer) and again.vocab_size == tok.vocab_size
    text = "the singer in the thing 小明"
    assert again.encode(text) == tok.encode(text) and again.eos_id == tok.eos_id
    (tmp_path / "tokenizer.bpe").unlink()
    with pytest.raises(TokenizerError, match="tokenizer.bpe is missing"):
        load_tokenizer(tmp_path)


def test_unreadable_sources_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(TokenizerError, match="no such file"):
        GPT2Tokenizer.from_files(tmp_path / "merges.txt", tmp_path / "vocab.json")
    (tmp_path / "merges.txt").write_text("#version: 0.2\nx y\n")
    (tmp_path / "vocab.json").write_text('{"a": 0}')
    with pytest.raises(TokenizerError, match="not a pair of BPE merges"):
        GPT2Tokenizer.from_files(tmp_path / "merges.txt", tmp_path / "vocab.json")

    def offline():
        raise ConnectionError("no network")

    # A well-formed pair of data-gym files (GPT-2's format) for another, smaller BPE: the 256 bytes,
    # written as GPT-2 writes them (printable ones as themselves, the others from chr(256) on), and one merge.
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    as_char = {b: chr(b) for b in printable}
    as_char.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in as_char)})
    order = printable + [b for b in range(256) if b not in printable]
    vocab = {as_char[b]: rank for rank, b in enumerate(order)} | {"th": 256}
    (tmp_path / "merges.txt").write_text("#version: 0.2\nt h\n", encoding="utf-8")
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(TokenizerError, match="257 tokens, where GPT-2 has 50256"):
        GPT2Tokenizer.from_files(tmp_path / "merges.txt", tmp_path / "vocab.json")

    monkeypatch.setattr("tiktoken_ext.openai_public.gpt2", offline)
    with pytest.raises(TokenizerError, match="from_files"):
        GPT2Tokenizer.from_tiktoken()


@pytest.fixture
def hf_folder(tmp_path, monkeypatch):
    """A small random GPT-2 saved as Hugging Face saves it, whose vocabulary is the small BPE's."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    tok = small_gpt2_like()
    cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=tok.eos_id, eos_token_id=tok.eos_id)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    monkeypatch.setattr(GPT2Tokenizer, "from_tiktoken", classmethod(lambda cls: small_gpt2_like()))
    return tmp_path / "hf", hf, tok


def test_qkv_convert_gpt2_writes_a_run_that_generates_like_hf(hf_folder, tmp_path, capsys, monkeypatch):
    folder, hf, tok = hf_folder
    run = tmp_path / "run"
    assert qkv.cli.main(["convert", "gpt2", "--from", str(folder), "--run", str(run)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["vocab_size"] == tok.vocab_size and summary["context"] == 32

    from qkv.runs import load_model

    model, loaded = load_model(run, device="cpu")
    x = torch.tensor([tok.encode("the thing in the")])
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x).logits, atol=1e-4, rtol=0)
        expected = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=tok.eos_id)[0, x.shape[1]:].tolist()
    assert qkv.cli.main(["generate", "--run", str(run), "the thing in the", "-n", "8", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == "the thing in the" + tok.decode(expected) + "\n"
    with pytest.raises(ValueError, match="already holds a run"):
        from qkv.training.lm_run import convert_gpt2_run

        convert_gpt2_run(folder, run)


def test_convert_takes_the_tokenizer_files_from_their_own_folder(hf_folder, tmp_path, capsys, monkeypatch):
    folder, hf, tok = hf_folder
    read = []
    monkeypatch.setattr(GPT2Tokenizer, "from_files",
                        classmethod(lambda cls, merges, vocab: read.append((merges, vocab)) or small_gpt2_like()))
    files = tmp_path / "tokenizer"
    files.mkdir()
    (files / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    argv = ["convert", "gpt2", "--from", str(folder), "--tokenizer", str(files), "--run", str(tmp_path / "run")]
    assert qkv.cli.main(argv) == 2  # vocab.json is missing
    assert capsys.readouterr().err == (f"qkv convert: error: {files}: no vocab.json (GPT-2's tokenizer files, as "
                                       "save_pretrained writes them)\n")
    (files / "vocab.json").write_text("{}", encoding="utf-8")
    assert qkv.cli.main(argv) == 0
    assert read == [(files / "merges.txt", files / "vocab.json")]


def test_convert_names_what_to_install_and_what_is_not_there(hf_folder, tmp_path, capsys, monkeypatch):
    import importlib

    argv = ["convert", "gpt2", "--from", str(tmp_path / "nothing"), "--run", str(tmp_path / "run")]
    assert qkv.cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(f"qkv convert: error: {tmp_path / 'nothing'}: no GPT-2 weights there")
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: (_ for _ in ()).throw(
        ModuleNotFoundError(name)) if name == "transformers" else real(name, *a))
    assert qkv.cli.main(argv) == 2
    assert capsys.readouterr().err == ("qkv convert: error: qkv convert gpt2 needs transformers, an optional part "
                                       "of qkv: pip install 'qkv[hf]'\n")


def test_a_recipe_can_ask_for_gpt2s_tokenizer(monkeypatch):
    from qkv.config import ConfigError
    from qkv.training.lm_run import LMDataConfig
    from qkv.training.train_lm import build_tokenizer

    monkeypatch.setattr(GPT2Tokenizer, "from_tiktoken", classmethod(lambda cls: small_gpt2_like()))
    tok = build_tokenizer(LMDataConfig(tokenizer="gpt2"), ["any text: GPT-2's BPE is not trained"])
    assert isinstance(tok, GPT2Tokenizer) and tok.vocab_size == 264
    with pytest.raises(ConfigError, match="'char', 'bytelevel' or 'gpt2'"):
        LMDataConfig(tokenizer="gpt-2")
