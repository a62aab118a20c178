"""Shared fixtures of the interpret tests: real tiny translation (trained) and GPT (untrained) run directories;
and ``figures_reference``, the Python reference of the page's figures.js (only tests use it, so it lives here
and not in the package), importable by that name in these tests."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from qkv.config import ModelConfig
from qkv.settings import to_dict

_spec = importlib.util.spec_from_file_location("figures_reference", Path(__file__).with_name("figures_reference.py"))
sys.modules["figures_reference"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["figures_reference"])

SENTENCES = ["小明累了，他想睡觉。", "Xiaoming is tired, he wants to sleep."]


@pytest.fixture(scope="session")
def mt_run(tmp_path_factory):
    """A translation run directory of a tiny *trained* model, written by the real trainer.

    2 layers x 2 heads, d_model 16, 40 steps on the embedded demo corpus (a few seconds): every kind
    of map (encoder self, decoder self, cross) exists and has learned something. Session-scoped.
    """
    from qkv.data.translation import DataConfig
    from qkv.training.train_mt import MTRecipe, MTTrainConfig, train

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
