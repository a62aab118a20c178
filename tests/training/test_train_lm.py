"""The GPT pretraining loop: exact resume, --init-from, the run directory, and clear errors."""

import json
from dataclasses import replace

import pytest
import torch

import qkv.cli

from qkv.errors import ConfigError, DataError
from qkv.settings import from_dict, recipe_file, recipe_names
from qkv.data.lm import load_splits, split_documents
from qkv.evaluation.validation import evaluate_tokens
from qkv.runs import Run, RunError, load_model
from qkv.recipes import LMRecipe
from qkv.training.lm_run import load_run_recipe
from qkv.training import recipes
from qkv.training.train_lm import train_lm



TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 12


def tiny(tmp_path, **train):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    settings = dict(batch_size=4, steps=10, warmup=2, eval_every=5, eval_iters=2, log_every=1, lr=3e-3)
    settings.update(train)
    return from_dict(LMRecipe, {
        "model": {"d_model": 32, "n_heads": 4, "d_ff": 64, "n_layers": 2, "max_len": 16, "dropout": 0.1},
        "data": {"path": str(corpus)},
        "train": settings,
    })


def test_resume_gives_the_losses_of_the_uninterrupted_run(tmp_path):
    recipe = tiny(tmp_path, accumulate=2)
    straight = train_lm(recipe, tmp_path / "a", quiet=True, plot=False)
    first = train_lm(recipe, tmp_path / "b", stop_at=3, quiet=True, plot=False)
    assert first.step == 3
    assert Run(tmp_path / "a").exists and not Run(tmp_path / "b").exists  # stopped part way: not finished
    torch.manual_seed(12345)  # a new process starts from other RNG states
    rest = train_lm(load_run_recipe(tmp_path / "b"), tmp_path / "b", resume=True, quiet=True, plot=False)
    assert first.losses + rest.losses == straight.losses and Run(tmp_path / "b").exists
    assert len(straight.losses) == 10
    a, b = load_model(tmp_path / "a")[0], load_model(tmp_path / "b")[0]
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    assert straight.final["loss"] == rest.final["loss"]


def _events(run):
    """metrics.jsonl without its clock fields."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "elapsed", "train_seconds")} for r in rows]


def test_a_crash_after_a_checkpoint_resumes_to_the_same_metrics_line_for_line(tmp_path, monkeypatch, crash_at):
    """Steps 6-7 are logged after the checkpoint at step 5, then the run dies: the resumed run logs them again,
    and metrics.jsonl holds them once."""
    recipe = tiny(tmp_path)
    train_lm(recipe, tmp_path / "a", quiet=True, plot=False)
    crash_at(8)
    with pytest.raises(KeyboardInterrupt):
        train_lm(recipe, tmp_path / "b", quiet=True, plot=False)
    monkeypatch.undo()
    assert [e["step"] for e in _events(tmp_path / "b")][-1] == 7
    train_lm(load_run_recipe(tmp_path / "b"), tmp_path / "b", resume=True, quiet=True, plot=False)
    assert _events(tmp_path / "b") == _events(tmp_path / "a")


def test_the_run_directory_holds_everything_and_the_loss_falls(tmp_path):
    result = train_lm(tiny(tmp_path, steps=30, eval_every=10), tmp_path / "run", quiet=True, plot=False)
    run = tmp_path / "run"
    for name in ("config.json", "tokenizer.json", "tokens.bin", "last.safetensors", "last.pt",
                 "best.safetensors", "model.safetensors", "metrics.jsonl"):
        assert (run / name).is_file(), name
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"]["vocab_size"] == len(set(TEXT)) + 4  # set from the tokenizer (+ 4 specials)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [10, 20, 30]
    assert records[-1]["split"] == "valid_full" and records[-1]["loss"] == pytest.approx(result.final["loss"])
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5 - 0.3


def test_a_run_split_by_document_validates_on_the_held_out_documents(tmp_path, capsys):
    recipe = tiny(tmp_path)
    recipe = replace(recipe, data=replace(recipe.data, split="documents"))
    train_lm(recipe, tmp_path / "run", quiet=True, plot=False)
    tokenizer = Run(tmp_path / "run").tokenizer()
    train, valid = load_splits(tmp_path / "run" / "tokens.bin", 0.1)
    held_out = split_documents(TEXT, 0.1)[1]  # documents 9 and 19 of 25 (TEXT's last runs into its first)
    assert valid.tolist() == tokenizer.encode(held_out) and held_out.count("\n\n") == 2
    assert len(train) + len(valid) == len(tokenizer.encode(split_documents(TEXT, 0.1)[0] + held_out))
    assert load_run_recipe(tmp_path / "run").data.split == "documents"
    assert qkv.cli.main(["eval", "lm", "--run", str(tmp_path / "run"), "--json"]) == 0  # scores the same split
    held_out_loss = evaluate_tokens(load_model(tmp_path / "run")[0], valid, 16, 32)["loss"]
    assert json.loads(capsys.readouterr().out)["loss"] == pytest.approx(held_out_loss)


def test_resume_refuses_a_new_model_or_data_and_leaves_the_run_resumable(tmp_path):
    train_lm(tiny(tmp_path, steps=4), tmp_path / "run", quiet=True, plot=False)
    config = (tmp_path / "run" / "config.json").read_text()
    saved = load_run_recipe(tmp_path / "run")
    for changed in (replace(saved, model=replace(saved.model, d_model=64)),
                    replace(saved, data=replace(saved.data, split="documents"))):
        with pytest.raises(ConfigError, match="(model.d_model=64|data.split='documents') .the run's: .*another run"):
            train_lm(replace(changed, train=replace(changed.train, steps=6)), tmp_path / "run", resume=True, quiet=True,
                     plot=False)
        assert (tmp_path / "run" / "config.json").read_text() == config
    more = replace(saved, train=replace(saved.train, steps=6),  # train.* may change: on to step 6
                   data=replace(saved.data, data_dir=str(tmp_path)))  # and where the corpus is looked for
    assert train_lm(more, tmp_path / "run", resume=True, quiet=True, plot=False).step == 6


def test_max_minutes_ends_the_run_like_its_last_step(tmp_path):
    result = train_lm(tiny(tmp_path, max_minutes=1e-9), tmp_path / "run", quiet=True, plot=False)
    assert result.step == 1  # out of time after the first step, long before steps=10
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "valid"] == [1]
    assert records[-1]["split"] == "valid_full" and (tmp_path / "run" / "model.safetensors").is_file()
    with pytest.raises(ConfigError, match="max_minutes"):
        tiny(tmp_path, max_minutes=0)


def test_init_from_takes_weights_only_with_a_fresh_optimizer(tmp_path):
    train_lm(tiny(tmp_path), tmp_path / "base", quiet=True, plot=False)
    base = load_model(tmp_path / "base")[0]
    # A learning rate so small that one step moves nothing visibly: the start is the base weights.
    fresh = tiny(tmp_path, steps=2, lr=1e-12, min_lr=0.0, warmup=1, eval_every=2)
    train_lm(fresh, tmp_path / "child", init_from=tmp_path / "base", quiet=True, plot=False)
    child = load_model(tmp_path / "child", "last")[0]
    for (name, p), q in zip(base.state_dict().items(), child.state_dict().values()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)
    state = torch.load(tmp_path / "child" / "last.pt", weights_only=True)
    steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {2}  # the optimizer counted only this run's steps
    assert state["state"]["loop"]["step"] == 2


def test_resume_and_new_runs_refuse_the_wrong_directory(tmp_path):
    recipe = tiny(tmp_path, steps=2, eval_every=2, warmup=1)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train_lm(recipe, tmp_path / "none", resume=True, quiet=True, plot=False)
    train_lm(recipe, tmp_path / "run", quiet=True, plot=False)
    with pytest.raises(ValueError, match="already holds a run"):
        train_lm(recipe, tmp_path / "run", quiet=True, plot=False)
    with pytest.raises(ValueError, match="is the run this one would replace"):
        train_lm(recipe, tmp_path / "run", overwrite=True, init_from=tmp_path / "." / "run", quiet=True, plot=False)
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_a_run_that_could_not_start_leaves_nothing_behind(tmp_path):
    """A corpus too short to train on fails after the tokenizer and config are written: they go again, so that
    the corrected command starts the run without --overwrite; a resumed run's files are never removed."""
    recipe = tiny(tmp_path, steps=2, eval_every=2, warmup=1)
    short = tmp_path / "short.txt"
    short.write_text("a", encoding="utf-8")  # one token
    with pytest.raises(ValueError, match="has 1 tokens"):
        train_lm(replace(recipe, data=replace(recipe.data, path=str(short))), tmp_path / "run", quiet=True, plot=False)
    assert not (tmp_path / "run").exists()  # the folder it made goes too
    (tmp_path / "empty.txt").write_text(" \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.txt: no text to train on"):
        train_lm(replace(recipe, data=replace(recipe.data, path=str(tmp_path / "empty.txt"))), tmp_path / "run",
                 quiet=True, plot=False)
    train_lm(recipe, tmp_path / "run", quiet=True, plot=False)  # the corrected command, no --overwrite
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    with pytest.raises(RuntimeError, match="inside"), Run(tmp_path / "run").starting(resume=True):
        raise RuntimeError("inside")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


def test_an_overwrite_that_cannot_start_puts_the_old_run_back(tmp_path):
    recipe = tiny(tmp_path, steps=2, eval_every=2, warmup=1)
    run = tmp_path / "run"
    train_lm(recipe, run, quiet=True, plot=False)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    mistyped = replace(recipe, data=replace(recipe.data, path=str(tmp_path / "typo.txt")))
    with pytest.raises(DataError, match="file not found: .*typo.txt"):
        train_lm(mistyped, run, overwrite=True, quiet=True, plot=False)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # byte for byte, nothing set aside left over
    train_lm(replace(recipe, train=replace(recipe.train, steps=3)), run, overwrite=True, quiet=True, plot=False)
    assert not (run / ".replaced").exists() and load_run_recipe(run).train.steps == 3  # replaced, as asked

    # What a kill between the two leaves: the old run set aside, the new one's first files. No start passes it by.
    (run / ".replaced").mkdir()
    for name in ("model.safetensors", "last.pt"):
        (run / name).rename(run / ".replaced" / name)
    for overwrite in (False, True):
        with pytest.raises(RunError, match=r"\.replaced holds the run that an --overwrite .* was replacing"):
            train_lm(recipe, run, overwrite=overwrite, quiet=True, plot=False)
    assert sorted(p.name for p in (run / ".replaced").iterdir()) == ["last.pt", "model.safetensors"]
    # One that never trained (a grid's variant killed before its first checkpoint) holds nothing to keep.
    for name in ("model.safetensors", "last.pt"):
        (run / ".replaced" / name).unlink()
    train_lm(recipe, run, overwrite=True, quiet=True, plot=False)
    assert not (run / ".replaced").exists() and (run / "model.safetensors").is_file()


def test_recipe_errors_name_the_key(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("model:\n  d_model: 32\n  n_heads: 4\ntrain:\n  step: 10\n")
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        recipes.load("lm", path)
    path.write_text("model:\n  max_len: 32\ntrain:\n  context: 64\n")
    with pytest.raises(ConfigError, match="exceeds model.max_len"):
        recipes.load("lm", path)
    path.write_text("model:\n  max_len: 32\n")
    assert recipes.load("lm", path, ["train.context=16"]).context == 16
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA only"):
            train_lm(tiny(tmp_path, dtype="bf16"), tmp_path / "bf16", quiet=True, plot=False)


def test_shipped_recipes_load_by_name():
    baby = recipes.load("lm", "baby")
    assert (baby.model.n_layers, baby.model.n_heads, baby.model.d_model, baby.context) == (4, 4, 128, 64)
    assert (baby.train.batch_size, baby.train.lr, baby.model.dropout, baby.train.steps) == (12, 1e-3, 0.0, 2000)
    assert recipes.load("lm", "shakespeare_char").model.n_layers == 6
    for name in recipe_names("lm"):
        assert f"qkv train lm --recipe {name}" in recipe_file("lm", name).read_text(encoding="utf-8")
        assert recipes.load("lm", name).train.steps > 0  # every shipped recipe reads, with its checks
