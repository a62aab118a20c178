"""Shared test settings: seeded, and one thread.

The models in tests are tiny: with two threads every operation pays OpenMP's fork and join (and stalls
outright when the other core is busy), so one thread is 10-30x faster here and gives the same results.
"""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from qkv.cli import main
from qkv.config import ModelConfig
from qkv.settings import to_dict
from qkv.accel import kernels, precompiled


def pytest_configure(config):
    torch.set_num_threads(1)
    # Decoding's kernel choices are measured into a file of the test session's own, not the user's cache
    # (subprocesses inherit it).
    os.environ[kernels.CACHE_ENV] = os.path.join(tempfile.mkdtemp(prefix="qkv-kernels-"), "kernels.json")
    # qkv generate compiles no step in the background (a process outliving its test): the tests that build
    # one turn it back on.
    os.environ[precompiled.BACKGROUND_ENV] = "0"


ROOT = Path(__file__).resolve().parent.parent


def _untracked() -> set[str] | None:
    """The files git sees in the work tree and does not track or ignore (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return {line[3:] for line in out.stdout.splitlines() if line.startswith("?? ")}


def pytest_sessionstart(session):
    session.config._qkv_untracked = _untracked()


def pytest_sessionfinish(session, exitstatus):
    """The tests leave the work tree as they found it: a file they write outside a temporary folder and outside
    what .gitignore names (a notebook's runs, a demo's) fails the session, named."""
    before = getattr(session.config, "_qkv_untracked", None)
    after = _untracked()
    if before is None or after is None:
        return
    new = sorted(after - before)
    if new:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            "FAILED: the tests left files git does not ignore in the work tree: " + ", ".join(new[:10]), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def untracked_files():
    """What git sees untracked in the work tree now (the check the session ends with)."""
    return _untracked


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 30


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory):
    """Three tiny trained runs (a translation run, a character GPT, a byte-level BPE GPT) that the export tests
    take to other libraries; ``text`` is the GPTs' corpus."""
    root = tmp_path_factory.mktemp("export")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    out = {}
    for name, argv in {
        "mt": ["train", "mt", "--recipe", "demo", "model.d_model=32", "model.n_heads=4", "model.d_ff=64",
               "model.n_layers=2", "model.dropout=0", "data.demo_train=2000", "train.steps=600", "train.warmup=20",
               "train.eval_every=600", "train.eval_bleu_sentences=0", "train.test_beam=1", "train.average_last=0"],
        "gpt_char": ["train", "lm", "--recipe", "baby", f"data.path={root / 'text.txt'}", "model.d_model=32",
                     "model.n_heads=2", "model.n_layers=2", "model.d_ff=64", "model.max_len=32", "train.context=32", "train.steps=60",
                     "train.eval_every=60", "train.eval_iters=1", "train.warmup=5"],
        "gpt_bpe": ["train", "lm", "--recipe", "baby", f"data.path={root / 'text.txt'}", "data.tokenizer=bytelevel",
                    "data.vocab_size=300", "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64",
                    "model.max_len=32", "train.context=32", "train.steps=40", "train.eval_every=40", "train.eval_iters=1",
                    "train.warmup=5"],
    }.items():
        assert main([*argv, "train.threads=1", "--run", str(root / name), "--quiet"]) == 0, name
        out[name] = root / name
    out["text"] = TEXT
    return out


# Real tiny runs for the views of a model (interpret) and its graphs (interop): a trained translator and an
# untrained GPT.
SENTENCES = ["小明累了，他想睡觉。", "Xiaoming is tired, he wants to sleep."]


@pytest.fixture(scope="session")
def mt_run(tmp_path_factory):
    """A translation run directory of a tiny *trained* model, written by the real trainer.

    2 layers x 2 heads, d_model 16, 40 steps on the embedded demo corpus (a few seconds): every kind
    of map (encoder self, decoder self, cross) exists and has learned something. Session-scoped.
    """
    from qkv.data.translation import DataConfig
    from qkv.recipes import MTRecipe, MTTrainConfig
    from qkv.training.train_mt import train

    path = tmp_path_factory.mktemp("mt_run") / "run"
    cfg = MTRecipe(
        model=ModelConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=64),
        data=DataConfig(corpus="demo", vocab_size=120, max_tokens=400, max_src_len=40, max_tgt_len=40,
                        demo_train=400, demo_valid=8, demo_test=8),
        train=MTTrainConfig(steps=100, warmup=5, peak_lr=3e-3, eval_every=100, eval_bleu_sentences=0, test_beam=1),
    )
    torch.manual_seed(0)
    train(cfg, path, quiet=True)
    return path


@pytest.fixture(scope="session")
def gpt_run(tmp_path_factory):
    """A GPT run directory with an untrained tiny model: 3 layers x 3 heads (unlike ``mt_run``'s 2 x 2)."""
    from qkv.models.gpt import GPT
    from qkv.tokenizers.bpe import BPETokenizer
    from qkv.weights import save_weights

    path = tmp_path_factory.mktemp("gpt_run")
    tok = BPETokenizer.train(SENTENCES * 5, vocab_size=80)
    cfg = ModelConfig(arch="gpt", vocab_size=tok.vocab_size, d_model=24, n_heads=3, d_ff=32, n_layers=3,
                      dropout=0.0, max_len=64)
    torch.manual_seed(0)
    tok.save(path)
    (path / "config.json").write_text(json.dumps({"model": to_dict(cfg), "train": {"context": 64}}))
    save_weights(path / "model.safetensors", GPT(cfg))
    return path
