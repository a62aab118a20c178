"""Training MFU and decoding speed on one GPU: what ``bench/gpu_check.sh`` measures, as one JSON.

- Training: the paper's base Transformer (d_model 512, 6+6 layers, 37k shared vocabulary; sources and
  targets of 64 tokens, 25k target tokens a step as Section 5.1) and the GPT-2 small preset (124M,
  1,024-token windows), bf16 autocast, fused AdamW, ``torch.compile`` of the step's model. FLOPs are
  counted, not estimated: ``torch.utils.flop_counter`` on one forward and backward (the attention
  products included), divided by the median step time and the device's dense bf16 peak.
- Decoding: GPT-2 small greedy, batch 1 and 8, 128 new tokens (tokens/s); the base Transformer's beam
  4 on 16 sources of 30 tokens (sentences/s). Random weights: the speed, not the text, is measured.

    python bench/gpu_check.py --out bench/results/gpu_check.json
    python bench/gpu_check.py --device cpu --small     # the script itself, on a laptop (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from qkv.config import preset
from qkv.generation import generate
from qkv.generation.beam import beam_search
from qkv.models.gpt import GPT
from qkv.models.transformer import Transformer
from qkv.training.optim import build_adamw

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

# Dense (no sparsity) bf16 tensor-core peaks, from the vendors' data sheets, in FLOP/s.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


def peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step_mfu(name: str, model: torch.nn.Module, batch: tuple, loss_fn, device: torch.device, steps: int,
                   tokens: int) -> dict:
    amp = torch.bfloat16 if device.type == "cuda" else None
    optimizer = build_adamw(model, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.1)
    forward = torch.compile(model) if device.type == "cuda" else model

    def step() -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn(forward, *batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:  # on the eager model: the compiled one hides its ops
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss_fn(model, *batch).backward()
    flops = counter.get_total_flops()
    optimizer.zero_grad(set_to_none=True)
    for _ in range(3):  # compile and warm up
        step()
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    top = peak(device)
    return {"model": name, "parameters": sum(p.numel() for p in model.parameters()), "flops_per_step": flops,
            "step_s_median": seconds, "tokens_per_s": tokens / seconds, "tflops": flops / seconds / 1e12,
            "mfu": None if top is None else flops / seconds / top, "peak_tflops": None if top is None else top / 1e12}


def gpt_loss(model, x, y):
    return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())


def mt_loss(model, src, tgt_in, tgt_out):
    return F.cross_entropy(model(src, tgt_in).float().flatten(0, 1), tgt_out.flatten(), label_smoothing=0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny sizes: check the script, not the machine")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="bench/results/gpu_check.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    small = args.small
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "train": [], "decode": {}}

    # The paper's base model: batches of 25k target tokens (400 pairs of 64 + 64 tokens).
    cfg = preset("tiny-transformer" if small else "transformer-base", vocab_size=1000 if small else 37000,
                 dropout=0.1, max_len=128)
    pairs, length = (8, 16) if small else (400, 64)
    mt = Transformer(cfg).to(device)
    src = torch.randint(4, cfg.vocab_size, (pairs, length), device=device)
    tgt = torch.randint(4, cfg.vocab_size, (pairs, length + 1), device=device)
    report["train"].append(train_step_mfu("transformer-base", mt, (src, tgt[:, :-1], tgt[:, 1:]), mt_loss, device,
                                          args.steps, pairs * length))
    print(json.dumps(report["train"][-1]), file=sys.stderr)

    gcfg = preset("tiny-gpt" if small else "gpt2-small", dropout=0.0)
    batch, context = (4, 32) if small else (16, 1024)
    gpt = GPT(gcfg).to(device)
    x = torch.randint(0, gcfg.vocab_size, (batch, context + 1), device=device)
    report["train"].append(train_step_mfu("gpt2-small", gpt, (x[:, :-1], x[:, 1:]), gpt_loss, device, args.steps,
                                          batch * context))
    print(json.dumps(report["train"][-1]), file=sys.stderr)

    gpt.eval()
    new = 16 if small else 128
    for b in (1, 8):
        prompts = torch.randint(0, gcfg.vocab_size, (b, 8)).tolist()
        generate(gpt, prompts, 8, temperature=0)  # warm up
        sync(device)
        t0 = time.perf_counter()
        generate(gpt, prompts, new, temperature=0)
        sync(device)
        report["decode"][f"gpt_greedy_batch{b}_tokens_per_s"] = b * new / (time.perf_counter() - t0)
    mt.eval()
    sources = torch.randint(4, cfg.vocab_size, (16, 30), device=device)
    with torch.no_grad():
        beam_search(mt, sources[:2], 1, 2, beam_size=4, limit=10)  # warm up
        sync(device)
        t0 = time.perf_counter()
        beam_search(mt, sources, 1, 2, beam_size=4, limit=30)
        sync(device)
    report["decode"]["mt_beam4_16x30_sentences_per_s"] = 16 / (time.perf_counter() - t0)
    write_result(args.out, report)


if __name__ == "__main__":
    main()
