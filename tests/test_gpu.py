"""On CUDA: the same numbers as the CPU in fp32, bf16 training that learns, the decoding invariants, DDP on nccl.

Marked ``gpu``; each test skips where torch sees no CUDA device (``bench/gpu_check.sh`` runs them on a
GPU machine). Tolerances: fp32 CPU vs GPU logits within 1e-4 with TF32 off (TF32 is what training
uses, and rounds products to 10 bits of mantissa); fused (flash / memory-efficient) and explicit
attention under bf16 autocast within 2e-2, bf16's own rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from qkv.config import preset
from qkv.settings import from_dict
from qkv.generation import generate
from qkv.generation.beam import beam_search, greedy_search
from qkv.models.gpt import GPT
from qkv.models.transformer import Transformer
from qkv.modules.attention import scaled_dot_product_attention
from qkv.recipes import LMRecipe, MTRecipe
from qkv.training.logging import read_metrics
from qkv.evaluation.losses import label_smoothed_nll
from qkv.training.train_lm import train_lm
from qkv.training.train_mt import train as train_mt

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n") * 200
BOS, EOS, PAD = 1, 2, 0


@pytest.fixture
def exact_fp32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _transformer() -> Transformer:
    torch.manual_seed(0)
    model = Transformer(preset("tiny-transformer", vocab_size=24, dropout=0.0, tie_embeddings=False, max_len=40))
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 3.0  # outputs end at varied lengths
    return model.eval()


def _sources() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 24, (6, 9), generator=g)
    for row, length in enumerate([9, 7, 3, 5, 1, 8]):
        src[row, length:] = PAD
    return src


def test_gpu_logits_equal_cpu_logits_in_fp32(exact_fp32):
    torch.manual_seed(0)
    gpt = GPT(preset("tiny-gpt")).eval()
    x = torch.randint(0, 64, (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(gpt.cuda()(x.cuda()).cpu(), gpt.cpu()(x), atol=1e-4, rtol=0)
        model, src = _transformer(), _sources()
        tgt = torch.randint(4, 24, (6, 7))
        cpu = model(src, tgt)
        torch.testing.assert_close(model.cuda()(src.cuda(), tgt.cuda()).cpu(), cpu, atol=1e-4, rtol=0)


def test_the_loss_and_its_written_gradient_equal_the_cpu_s():
    # The backward pass zeroes ignored rows by a mask on CUDA and by index on a CPU.
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(40, 300, generator=g) * 3
    targets = torch.randint(1, 300, (40,), generator=g)
    targets[::3] = PAD
    scores[targets == PAD] = float("inf")  # an ignored row's scores reach neither the loss nor the gradient
    results = []
    for device in ("cpu", "cuda"):
        x = scores.to(device).requires_grad_(True)
        out = label_smoothed_nll(x, targets.to(device), smoothing=0.1, ignore_index=PAD)
        out.loss.backward()
        results.append((out.loss.cpu(), out.nll.cpu(), x.grad.cpu()))
    for cpu, cuda in zip(*results):
        torch.testing.assert_close(cuda, cpu, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(results[1][2]).all()


def test_fused_attention_equals_explicit_under_bf16_autocast():
    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda") for _ in range(3))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for causal in (False, True):
            fused, _ = scaled_dot_product_attention(q, k, v, is_causal=causal)
            explicit, _ = scaled_dot_product_attention(q, k, v, is_causal=causal, need_weights=True)
            torch.testing.assert_close(fused.float(), explicit.float(), atol=2e-2, rtol=0)


def test_cached_decoding_equals_uncached_and_beam_one_equals_greedy_on_gpu():
    gpt = GPT(preset("tiny-gpt")).cuda().eval()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    assert generate(gpt, prompts, 12, temperature=0, use_cache=True) == \
        generate(gpt, prompts, 12, temperature=0, use_cache=False)
    model, src = _transformer().cuda(), _sources().cuda()
    greedy = greedy_search(model, src, BOS, EOS, limit=20)
    assert greedy == greedy_search(model, src, BOS, EOS, limit=20, use_cache=False)
    assert [h[0].tokens for h in beam_search(model, src, BOS, EOS, beam_size=1, limit=20)] == greedy
    a = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4, limit=20)
    b = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4, limit=20, use_cache=False)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]


def _recipe(tmp_path, **train):
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    return from_dict(LMRecipe, {
        "model": {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, "max_len": 64, "dropout": 0.0},
        "data": {"path": str(tmp_path / "text.txt")},
        "train": {"steps": 60, "batch_size": 16, "context": 64, "eval_every": 30, "eval_iters": 4, "warmup": 5,
                  "lr": 3e-3, "device": "cuda", **train},
    })


@pytest.mark.parametrize("dtype", ["auto", "fp16"])  # auto: bf16 where the GPU has it; fp16 with a GradScaler
def test_half_precision_training_on_gpu_lowers_the_loss(tmp_path, dtype):
    result = train_lm(_recipe(tmp_path, dtype=dtype), tmp_path / "run", quiet=True, plot=False)
    assert result.losses[-1] < 0.6 * result.losses[0]
    assert result.final["loss"] < 2.5


def test_bf16_translation_training_learns_and_scores_its_bleu_in_bf16(tmp_path):
    """The translation trainer on CUDA: bf16 autocast for the steps, the validation loss and the beam search
    behind validation and test BLEU (which runs without a traceback and writes its hypotheses)."""
    recipe = from_dict(MTRecipe, {
        "model": {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_layers": 2, "dropout": 0.0, "max_len": 64},
        "data": {"corpus": "demo", "vocab_size": 200, "max_tokens": 600, "max_src_len": 40, "max_tgt_len": 40,
                 "demo_train": 400, "demo_valid": 16, "demo_test": 8},
        "train": {"steps": 60, "warmup": 10, "peak_lr": 3e-3, "eval_every": 30, "eval_bleu_sentences": 8,
                  "device": "cuda", "test_beam": 2, "log_every": 5},
    })
    summary = train_mt(recipe, tmp_path / "run", quiet=True).summary
    train = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    assert train[-1] < 0.7 * train[0]
    assert 0.0 <= summary["test"]["bleu"] <= 100.0 and summary["test"]["sentences"] == 8
    assert (tmp_path / "run" / "test.hyp").read_text(encoding="utf-8").count("\n") == 8


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP on nccl needs two GPUs")
def test_two_gpus_on_nccl_train_as_one_gpu_does(tmp_path, exact_fp32):
    recipe = tmp_path / "gpt.yaml"
    recipe.write_text(json.dumps({
        "model": {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, "max_len": 64, "dropout": 0.0},
        "data": {"path": str(tmp_path / "text.txt")},
        "train": {"steps": 10, "batch_size": 8, "context": 32, "eval_every": 10, "eval_iters": 2, "warmup": 2,
                  "device": "cuda", "dtype": "fp32"},
    }), encoding="utf-8")
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    env = {**os.environ, "NVIDIA_TF32_OVERRIDE": "0"}
    for run, extra in (("one", []), ("two", ["--nproc-per-node", "2"])):
        done = subprocess.run([sys.executable, "-m", "qkv", "train", "lm", "--recipe", str(recipe), "--run",
                               str(tmp_path / run), "--quiet", *extra], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b = (load_file(str(tmp_path / run / "last.safetensors")) for run in ("one", "two"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4
