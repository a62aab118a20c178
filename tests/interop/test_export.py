"""``qkv export hf``: a run as a Hugging Face folder, loaded back with ``from_pretrained`` and ``AutoTokenizer``.

Logits within 1e-4 of qkv's, ``generate`` token for token equal to qkv's decoding (greedy; beam 4 for
translation, both ranking by log-probability), ``AutoTokenizer`` encoding as qkv does; options HF cannot
express named; a folder never half written.
"""

import importlib

import pytest
import torch

from qkv.cli import main
from qkv.generation.beam import beam_search, greedy_search
from qkv.generation.decode import generate
from qkv.runs import load_model

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

SOURCES = ["小明累了，他想睡觉。", "他想睡觉。", "小明累了。", "我们去公园吧。"]
PROMPTS = ["First", "All:\nSpeak", "hear me"]
LIMIT = 30  # new tokens at most, for both sides


@pytest.fixture(scope="module")
def runs(trained_runs):
    return trained_runs


def export(run, out, *extra) -> int:
    return main(["export", "hf", "--run", str(run), "--out", str(out), *extra])


def test_a_translation_run_is_a_marian_model_that_translates_as_qkv_does(runs, tmp_path):
    out = tmp_path / "hf"
    assert export(runs["mt"], out) == 0
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()}
    model, tokenizer = load_model(runs["mt"], device="cpu")
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    auto = transformers.AutoTokenizer.from_pretrained(out)
    # The tokenizer: each source as qkv's Translator encodes it (its tokens, then <eos>).
    ids = [tokenizer.encode(s) + [tokenizer.eos_id] for s in SOURCES]
    assert [auto(s)["input_ids"] for s in SOURCES] == ids
    batch = auto(SOURCES, return_tensors="pt", padding=True)
    src = batch["input_ids"]  # (B, S), right-padded with <pad>
    assert (src == tokenizer.pad_id).any()  # sources of different lengths
    # The logits of teacher forcing, padding and all.
    tgt = torch.tensor([[tokenizer.bos_id] + (i[:-1] * 3)[:6] for i in ids])  # (B, 7)
    with torch.no_grad():
        ours, theirs = model(src, tgt), hf(**batch, decoder_input_ids=tgt).logits
    assert (ours - theirs).abs().max() < 1e-4
    # Decoding: greedy, and beam 4 ranking by log-probability (HF's length penalty is not GNMT's).
    greedy = greedy_search(model, src, tokenizer.bos_id, tokenizer.eos_id, limit=LIMIT)
    beams = [h[0].tokens for h in beam_search(model, src, tokenizer.bos_id, tokenizer.eos_id, beam_size=4,
                                               alpha=0.0, limit=LIMIT)]
    for beam, expected in ((1, greedy), (4, beams)):
        out_ids = hf.generate(**batch, num_beams=beam, length_penalty=0.0, max_new_tokens=LIMIT + 1)
        got = [[t for t in row[1:].tolist() if t not in (tokenizer.pad_id, tokenizer.eos_id)] for row in out_ids]
        # A translation that runs to the limit: qkv ends it with <eos> after LIMIT tokens, HF writes one
        # more token in place of that <eos>. Up to the limit they agree.
        assert [g[:LIMIT] for g in got] == expected, beam
        assert any(len(e) > 2 for e in expected)  # a model that says something
    assert auto.batch_decode(out_ids, skip_special_tokens=True) == [tokenizer.decode(e) for e in beams]


@pytest.mark.parametrize("name", ["gpt_char", "gpt_bpe"])
def test_a_gpt_run_is_a_gpt2_model_that_continues_as_qkv_does(runs, tmp_path, name):
    out = tmp_path / "hf"
    assert export(runs[name], out) == 0
    model, tokenizer = load_model(runs[name], device="cpu")
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    auto = transformers.AutoTokenizer.from_pretrained(out)
    assert [auto(p)["input_ids"] for p in PROMPTS] == [tokenizer.encode(p) for p in PROMPTS]
    assert auto.decode(tokenizer.encode(runs['text'][:80])) == runs['text'][:80]
    tokens = torch.tensor([tokenizer.encode(runs['text'][:60])[:20]])
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max() < 1e-4
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        ours = generate(model, [ids], max_new_tokens=12, temperature=0.0, eos_id=tokenizer.eos_id)[0]
        theirs = hf.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        assert theirs[:len(ours)] == ours


def test_what_hf_cannot_express_is_named(runs, tmp_path, capsys):
    for option, kind in (("model.positional=rope", "mt"), ("model.norm=pre", "mt"), ("model.activation=swiglu", "lm")):
        run = tmp_path / option
        recipe = ["train", "mt", "--recipe", "demo", "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
                  "model.n_layers=1", "data.demo_train=50", "train.eval_bleu_sentences=0", "train.test_beam=1"] \
            if kind == "mt" else ["train", "lm", "--recipe", "baby", f"data.path={runs['gpt_char'].parent / 'text.txt'}",
                                  "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "train.eval_iters=1"]
        assert main([*recipe, option, "train.steps=1", "train.eval_every=1", "--run", str(run), "--quiet"]) == 0
        capsys.readouterr()
        assert export(run, tmp_path / "out") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and option.split("=")[0] in err and option.split("=")[1] in err, err
        assert not (tmp_path / "out").exists()


def test_a_folder_that_holds_something_is_replaced_only_when_asked(runs, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    assert export(runs["gpt_char"], out) == 2
    assert "is not empty: pass --overwrite" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert export(runs["gpt_char"], out, "--overwrite") == 0
    assert "notes.txt" not in {p.name for p in out.iterdir()} and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging or old folder left


def test_a_failed_export_leaves_the_old_folder_whole(runs, tmp_path, monkeypatch):
    out = tmp_path / "hf"
    assert export(runs["gpt_char"], out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "save_pretrained", disk_full)
    assert export(runs["gpt_char"], out, "--overwrite") == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_without_transformers_the_command_names_the_extra(runs, tmp_path, monkeypatch, capsys):
    real = importlib.import_module

    def without(name, *args):
        if name.split(".")[0] == "transformers":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without)
    assert export(runs["mt"], tmp_path / "hf") == 2
    assert capsys.readouterr().err == ("qkv export: error: exporting a translation model to Hugging Face needs "
                                       "transformers, an optional part of qkv: pip install 'qkv[hf]'\n")
