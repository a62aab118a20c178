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
    with pytest.raises(TokenizerError, match="qkv convert gpt2 --tokenizer FOLDER, or GPT2Tokenizer.from_files"):
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

    (tmp_path / "empty").mkdir()  # a folder, without weights
    argv = ["convert", "gpt2", "--from", str(tmp_path / "empty"), "--run", str(tmp_path / "run")]
    assert qkv.cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(f"qkv convert: error: {tmp_path / 'empty'}: no GPT-2 weights there")
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: (_ for _ in ()).throw(
        ModuleNotFoundError(name)) if name == "transformers" else real(name, *a))
    assert qkv.cli.main(argv) == 2
    assert capsys.readouterr().err == ("qkv convert: error: qkv convert gpt2 needs transformers, an optional part "
                                       "of qkv: pip install 'qkv[hf]'\n")


def test_convert_names_a_wrong_from_before_it_seeks_a_tokenizer(hf_folder, tmp_path, capsys, monkeypatch):
    """Offline, a missing --from folder is named as such, not as tiktoken's failed download; and the download's
    failure says how to give the tokenizer's files instead."""
    def offline(cls):
        raise TokenizerError("tiktoken could not load GPT-2's files (offline)")
    monkeypatch.setattr(GPT2Tokenizer, "from_tiktoken", classmethod(offline))
    for missing in (tmp_path / "nothing", "./nothing"):
        argv = ["convert", "gpt2", "--from", str(missing), "--run", str(tmp_path / "run")]
        assert qkv.cli.main(argv) == 2
        assert capsys.readouterr().err == (f"qkv convert: error: {missing}: no such folder (--from takes a folder "
                                           "saved by save_pretrained, or a model name to download such as gpt2)\n")
    import transformers

    def no_network(cls, name, *args, **kwargs):
        raise OSError(f"We couldn't connect to load the files of {name}")
    real = transformers.GPT2LMHeadModel.from_pretrained
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", classmethod(no_network))
    assert qkv.cli.main(["convert", "gpt2", "--from", "gpt2", "--run", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == ("qkv convert: error: gpt2: no GPT-2 weights there (We couldn't connect to "
                                       "load the files of gpt2)\n")  # the weights, asked first, not tiktoken
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", real)
    folder, hf, tok = hf_folder  # weights without the tokenizer's files beside them: tiktoken is asked, and fails
    assert qkv.cli.main(["convert", "gpt2", "--from", str(folder), "--run", str(tmp_path / "run")]) == 2
    assert "tiktoken could not load" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_converted_gpt2_fine_tunes_without_tokens_and_mixes_the_text_it_is_given(hf_folder, tmp_path, capsys):
    """A run without tokens.bin: plain SFT works; mixing needs --pretrain-text, and then measures forgetting."""
    from safetensors.torch import load_file

    folder, hf, tok = hf_folder
    run = tmp_path / "gpt2"
    assert qkv.cli.main(["convert", "gpt2", "--from", str(folder), "--run", str(run)]) == 0
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"the {w} is", "response": " the thing"}) + "\n"
                             for w in ("cat", "dog", "thing", "tree")), encoding="utf-8")
    text = tmp_path / "text.txt"
    text.write_text("the thing in the tree is the thing there. " * 40, encoding="utf-8")
    settings = ["train.steps=4", "train.warmup=1", "train.eval_every=2", "train.batch_size=2", "train.eval_iters=1"]

    def finetune(out, *options):
        return qkv.cli.main(["finetune", "--run", str(run), "--data", str(pairs), "--out", str(tmp_path / out),
                             "--quiet", *options, *settings])

    capsys.readouterr()
    assert finetune("sft") == 0
    result = json.loads(capsys.readouterr().out)
    assert "pretrain_loss" not in result["after"] and result["after"] == {}  # no --valid, no pretraining text
    base, tuned = load_file(str(run / "model.safetensors")), load_file(str(tmp_path / "sft" / "model.safetensors"))
    assert any(not torch.equal(base[k], tuned[k]) for k in base)

    assert finetune("mixed", "--mix", "0.5") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no tokens.bin" in err and "--pretrain-text FILE or a corpus name" in err
    assert finetune("typo", "--mix", "0.5", "--pretrain-text", "tinyshakespear") == 2
    assert "neither a file nor a registered corpus" in capsys.readouterr().err
    assert not (tmp_path / "mixed").exists() and not (tmp_path / "typo").exists()  # refused before writing

    assert finetune("mixed", "--mix", "0.5", "--pretrain-text", str(text)) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["before"]["pretrain_loss"] > 0 and result["after"]["pretrain_loss"] > 0
    lines = [json.loads(line) for line in (tmp_path / "mixed" / "metrics.jsonl").read_text().splitlines()]
    assert all("pretrain_loss" in r for r in lines if r["split"] == "train")


def test_a_recipe_can_ask_for_gpt2s_tokenizer(monkeypatch):
    from qkv.errors import ConfigError
    from qkv.recipes import LMDataConfig
    from qkv.training.train_lm import build_tokenizer

    monkeypatch.setattr(GPT2Tokenizer, "from_tiktoken", classmethod(lambda cls: small_gpt2_like()))
    tok = build_tokenizer(LMDataConfig(tokenizer="gpt2"), ["any text: GPT-2's BPE is not trained"])
    assert isinstance(tok, GPT2Tokenizer) and tok.vocab_size == 264
    with pytest.raises(ConfigError, match="'char', 'bytelevel' or 'gpt2'"):
        LMDataConfig(tokenizer="gpt-2")
