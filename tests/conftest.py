"""Shared test settings: seeded, and one thread.

The models in tests are tiny: with two threads every operation pays OpenMP's fork and join (and stalls
outright when the other core is busy), so one thread is 10-30x faster here and gives the same results.
"""

import os
import tempfile

import pytest
import torch

from qkv.cli import main
from qkv.accel import kernels, precompiled


def pytest_configure(config):
    torch.set_num_threads(1)
    # Decoding's kernel choices are measured into a file of the test session's own, not the user's cache
    # (subprocesses inherit it).
    os.environ[kernels.CACHE_ENV] = os.path.join(tempfile.mkdtemp(prefix="qkv-kernels-"), "kernels.json")
    # qkv generate compiles no step in the background (a process outliving its test): the tests that build
    # one turn it back on.
    os.environ[precompiled.BACKGROUND_ENV] = "0"


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
