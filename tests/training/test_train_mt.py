"""The translation trainer: run directory contents, exact resume, early stop, time budget, schedule, config errors."""

import json
import re
from dataclasses import replace

import pytest
import torch

from qkv.config import ModelConfig
from qkv.errors import ConfigError
from qkv.settings import apply_overrides, load_yaml, recipe_file, recipe_names
from qkv.data.translation import DataConfig
from qkv.generation.api import Translator
from qkv.weights import load_weights
from qkv.training.logging import read_metrics
from qkv.training.schedules import noam_lr
from qkv.training import recipes
from qkv.runs import Run
from qkv.recipes import MTRecipe, MTTrainConfig
from qkv.training.train_mt import learning_rate, train, translate_and_score

TINY = MTRecipe(
    model=ModelConfig(d_model=32, n_heads=4, d_ff=64, n_layers=1, dropout=0.1, max_len=64),
    data=DataConfig(corpus="demo", vocab_size=150, max_tokens=300, max_src_len=40, max_tgt_len=40,
                    demo_train=300, demo_valid=16, demo_test=8),
    train=MTTrainConfig(steps=6, warmup=2, peak_lr=2e-3, eval_every=3, eval_bleu_sentences=4, log_every=1,
                        keep_checkpoints=2, average_last=2, test_beam=2),
)


def tweak(cfg: MTRecipe, **train) -> MTRecipe:
    """``cfg`` with some of its train: knobs changed."""
    return replace(cfg, train=replace(cfg.train, **train))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A run of 6 steps in one go."""
    run = tmp_path_factory.mktemp("straight")
    summary = train(TINY, run, quiet=True).summary
    return run, summary


def _train_losses(run):
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"}


def test_run_directory_holds_everything(straight):
    run, summary = straight
    for name in ("config.json", "tokenizer.json", "model.safetensors", "last.safetensors", "last.pt",
                 "best.safetensors", "average.safetensors", "metrics.jsonl", "curves.png", "results.json", "test.hyp"):
        assert (run / name).is_file(), name
    assert len(list(run.glob("step_*.safetensors"))) == 2  # keep_checkpoints
    cfg = recipes.load("mt", None, run_dir=run, resume=True)
    assert cfg.model.vocab_size == json.loads((run / "tokenizer.json").read_text())["model"]["vocab"].__len__()
    assert summary["steps"] == 6 and summary["stop"] == "max_steps"
    assert summary["final"] in ("last", "best", "average")
    splits = {r["split"] for r in read_metrics(run / "metrics.jsonl")}
    assert {"train", "valid", "select", "test"} <= splits
    valid = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [3, 6] and all("bleu" in r for r in valid)
    assert len((run / "test.hyp").read_text(encoding="utf-8").splitlines()) == 8
    results = json.loads((run / "results.json").read_text())
    assert 0.0 <= results["test"]["bleu"] <= 100.0


def test_training_lowers_the_loss(straight):
    losses = _train_losses(straight[0])
    assert losses[6] < losses[1]


def test_resume_gives_the_same_losses_and_weights(straight, tmp_path):
    run, _ = straight
    cut = tmp_path / "cut"
    train(tweak(TINY, steps=3), cut, quiet=True)  # "interrupted" after step 3
    cfg = recipes.load("mt", None, ["train.steps=6"], cut, resume=True)
    summary = train(cfg, cut, resume=True, quiet=True).summary
    assert summary["steps"] == 6
    assert _train_losses(cut) == _train_losses(run)  # bit for bit, steps 1-6
    a = Translator.from_run(run, weights=run / "last.safetensors")
    b = Translator.from_run(cut, weights=cut / "last.safetensors")
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(p, q), name


def test_a_run_is_finished_when_its_job_ends_and_not_while_a_resume_trains_it(tmp_path, monkeypatch, crash_at):
    """Run.exists (what a notebook asks before it trains) is finished.json, written last: a finished run trained
    further is not finished again until that job ends, however it stops on the way."""
    run = tmp_path / "run"
    train(tweak(TINY, steps=3), run, quiet=True)
    assert Run(run).exists
    crash_at(5)
    with pytest.raises(KeyboardInterrupt):
        train(recipes.load("mt", None, ["train.steps=6"], run, resume=True), run, resume=True, quiet=True)
    monkeypatch.undo()
    assert Run(run).started and Run(run).has_checkpoint and not Run(run).exists
    train(recipes.load("mt", None, ["train.steps=6"], run, resume=True), run, resume=True, quiet=True)
    assert Run(run).exists and json.loads((run / "finished.json").read_text())["step"] == 6


def test_resume_refuses_a_new_model_or_data_and_leaves_the_run_resumable(tmp_path):
    run = tmp_path / "cut"
    train(tweak(TINY, steps=3), run, quiet=True)
    config = (run / "config.json").read_text()
    for change in ("model.d_model=16", "data.max_tokens=64"):
        with pytest.raises(ConfigError, match=re.escape(change.split("=")[0]) + r".*the run's.*another run"):
            train(recipes.load("mt", None, ["train.steps=4", change], run, resume=True), run, resume=True, quiet=True)
        assert (run / "config.json").read_text() == config  # not a config that no longer fits the checkpoint
    more = recipes.load("mt", None, ["train.steps=4", "data.test=valid"], run, resume=True)  # the end's split may change
    assert train(more, run, resume=True, quiet=True).step == 4


def test_a_crash_after_a_checkpoint_resumes_to_the_same_metrics_line_for_line(straight, tmp_path, monkeypatch,
                                                                             crash_at):
    """Step 4 is logged after the checkpoint at step 3, then the run dies at step 5: metrics.jsonl holds the
    resumed run's step 4 once, and equals the uninterrupted run's (clock fields aside)."""
    run, _ = straight
    crash_at(5)
    with pytest.raises(KeyboardInterrupt):
        train(TINY, tmp_path / "cut", quiet=True)
    monkeypatch.undo()
    train(recipes.load("mt", None, [], tmp_path / "cut", resume=True), tmp_path / "cut", resume=True, quiet=True)

    def events(r):
        clock = ("time", "elapsed", "tokens_per_s", "train_seconds", "seconds")
        return [{k: v for k, v in e.items() if k not in clock} for e in read_metrics(r / "metrics.jsonl")]

    assert events(tmp_path / "cut") == events(run)


def test_translator_loads_the_run(straight):
    run, _ = straight
    translator = Translator.from_run(run)
    texts = ["小明饿了，他想吃饭。", "", "Привет 🙂 ☃", "小红很忙，她想回家。", "因为小刚饿了，所以他想喝水。"]
    out = translator.translate(texts, beam=2)
    assert len(out) == 5 and out[1] == ""
    assert out == [translator.translate(t, beam=2) for t in texts]  # a batch = one by one
    assert isinstance(translator.translate("小红很忙。", beam=1), str)


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
def test_validation_bleu_decodes_under_the_runs_autocast(straight, amp):
    """On a GPU a run trains and scores its loss in bf16; its BLEU's beam search runs in bf16 too (here on the
    CPU's autocast, which has the same switch), and an fp32 run's search stays fp32."""
    run, _ = straight
    translator = Translator.from_run(run, device="cpu")
    seen = []
    translator.model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    src = ["小明饿了，他想吃饭。", "小红很忙，她想回家。"]
    scores, hyps = translate_and_score(translator.model, translator.tokenizer, src, ["x", "y"], beam=2, amp=amp)
    assert len(hyps) == 2 and 0.0 <= scores["bleu"] <= 100.0
    assert seen and set(seen) == {amp or torch.float32}


def test_fresh_run_refuses_to_overwrite(straight):
    run, _ = straight
    with pytest.raises(ValueError, match="already holds a run"):
        train(TINY, run, quiet=True)


def test_resume_without_checkpoint_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="last.pt"):
        train(TINY, tmp_path, resume=True, quiet=True)


def test_early_stop_when_validation_stops_improving(tmp_path):
    # A zero learning rate: the validation loss never improves after the first evaluation.
    cfg = tweak(TINY, peak_lr=0.0, steps=30, eval_every=2, patience=2, eval_bleu_sentences=0, test_beam=1)
    summary = train(cfg, tmp_path, quiet=True).summary
    assert summary["stop"] == "early_stop" and summary["steps"] == 6


def test_time_budget_stops_training(tmp_path):
    cfg = tweak(TINY, max_minutes=1e-6, steps=100, eval_bleu_sentences=0, test_beam=1)
    summary = train(cfg, tmp_path, quiet=True).summary
    assert summary["stop"] == "max_minutes" and summary["steps"] == 1
    assert (tmp_path / "last.pt").is_file()


def test_accumulation_takes_several_batches_per_update(tmp_path):
    """2 updates of 2 accumulated batches read the same data as 4 updates of one."""
    positions = []
    for accumulate, steps in ((2, 2), (1, 4)):
        cfg = tweak(TINY, accumulate=accumulate, steps=steps, eval_every=steps, eval_bleu_sentences=0,
                      test_beam=1)
        train(cfg, tmp_path / str(accumulate), quiet=True)
        positions.append(torch.load(tmp_path / str(accumulate) / "last.pt", weights_only=True)["state"]["data"])
    assert positions[0] == positions[1]
    assert positions[0]["epoch"] * 1000 + positions[0]["index"] > 0


def test_schedule_peak_and_paper_formula():
    cfg = tweak(TINY, warmup=10, peak_lr=1e-3)
    assert learning_rate(cfg, 10) == pytest.approx(1e-3)
    assert learning_rate(cfg, 5) == pytest.approx(5e-4)
    assert learning_rate(cfg, 40) == pytest.approx(5e-4)  # 1e-3 * sqrt(10 / 40)
    paper = tweak(cfg, peak_lr=None, lr_factor=2.0)
    assert learning_rate(paper, 7) == pytest.approx(noam_lr(7, 32, 10, 2.0))


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'warmup'"):
        apply_overrides(TINY, ["train.warmpu=10"])
    with pytest.raises(ConfigError, match="did you mean 'vocab_size'"):
        apply_overrides(TINY, ["data.vocab_sise=10"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_modle: 64\n")
    with pytest.raises(ConfigError, match="bad.yaml.*d_modle.*did you mean 'd_model'"):
        load_yaml(bad, MTRecipe)
    with pytest.raises(ConfigError, match="best_metric"):
        tweak(TINY, best_metric="accuracy")


def test_shipped_recipes_load_by_name():
    names = recipe_names("mt")
    assert set(names) >= {"demo", "multi30k_de_en", "multi30k_en_de", "cmn_eng_zh_en"}
    for name in names:
        cfg = recipes.load("mt", name)
        assert cfg.model.arch == "transformer"
        header = recipe_file("mt", name).read_text(encoding="utf-8").split("\nmodel:")[0]
        assert f"qkv train mt --recipe {name}" in header  # the header shows the command
    with pytest.raises(ConfigError, match="did you mean 'multi30k_de_en'"):
        recipes.load("mt", "multi30k_de_em")


def test_a_partial_model_section_keeps_the_recipe_default(tmp_path):
    """A recipe that sets one model key builds the recipe's default model, not the paper's 512 x 6."""
    f = tmp_path / "partial.yaml"
    f.write_text("model:\n  dropout: 0.3\ntrain:\n  steps: 5\n")
    cfg = recipes.load("mt", f)
    default = MTRecipe().model
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.dropout) == (default.d_model, default.n_layers, 0.3)
    assert cfg.train.steps == 5 and cfg.train.warmup == MTTrainConfig().warmup


def test_old_knob_names_are_refused_with_the_new_name(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text("train:\n  max_steps: 5\n")
    with pytest.raises(ConfigError, match="'max_steps' is called 'steps'"):
        recipes.load("mt", f)


def test_a_run_saved_before_the_recipe_shape_still_loads(straight, tmp_path):
    """A flat config.json (the translation runs written before recipes had sections) loads, upgraded."""
    run, _ = straight
    saved = json.loads((run / "config.json").read_text())
    flat = {"model": saved["model"], "data": saved["data"],
            **{("max_steps" if k == "steps" else k): v for k, v in saved["train"].items()}}
    old = tmp_path / "old"
    old.mkdir()
    for name in ("tokenizer.json", "model.safetensors"):
        (old / name).write_bytes((run / name).read_bytes())
    (old / "config.json").write_text(json.dumps(flat))
    assert recipes.load("mt", None, run_dir=old, resume=True) == recipes.load("mt", None, run_dir=run, resume=True)
    assert Translator.from_run(old).translate("小红很忙。", beam=1) == Translator.from_run(run).translate("小红很忙。", beam=1)


def test_weights_file_loads_into_the_configured_model(straight):
    run, _ = straight
    cfg = recipes.load("mt", None, run_dir=run, resume=True)
    from qkv.models.transformer import Transformer

    load_weights(run / "model.safetensors", Transformer(cfg.model))


def test_a_nan_at_a_checkpoint_step_never_reaches_the_disk(tmp_path, monkeypatch):
    """Loss NaN at step 4, a checkpoint step, with log_every (3) not dividing eval_every (2): the run stops
    before the update, and every file on disk holds the finite weights of step 2."""
    from safetensors.torch import load_file

    import qkv.training.train_mt as mt
    from qkv.models.transformer import Transformer
    from qkv.training.checkpoint import load_checkpoint
    from qkv.training.logging import NonFiniteLossError

    real, steps = mt.label_smoothed_nll, []

    def poisoned(logits, *args, **kw):
        out = real(logits, *args, **kw)
        if logits.requires_grad:  # a training batch, not a validation one
            steps.append(1)
            if len(steps) == 4:
                return out._replace(loss=out.loss * float("nan"))
        return out

    monkeypatch.setattr(mt, "label_smoothed_nll", poisoned)
    cfg = tweak(TINY, steps=6, eval_every=2, log_every=3, eval_bleu_sentences=0, test_beam=1)
    with pytest.raises(NonFiniteLossError, match="step 4"):
        train(cfg, tmp_path, quiet=True)
    for name in ("last.safetensors", "best.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(tmp_path / name).values()), name
    model = Transformer(recipes.load("mt", None, run_dir=tmp_path, resume=True).model)
    assert load_checkpoint(tmp_path, "last", model)["loop"]["step"] == 2


@pytest.mark.parametrize("override, message", [
    ("train.peak_lr=-1", "train.peak_lr must be a finite number >= 0"),
    ("train.test_beam=0", "train.test_beam must be >= 1"),
    ("train.weight_decay=-1", "train.weight_decay must be >= 0"),
    ("train.adam_betas=[0.9, 1.5]", "betas must be two numbers in [0, 1)"),
    ("train.test_alpha=.nan", "train.test_alpha must be a finite number"),
    ("train.seed=99999999999999999999", "train.seed must be in [0, 2^63)"),
])
def test_settings_that_would_fail_late_are_refused_as_the_recipe_is_read(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_overrides(TINY, [override])
