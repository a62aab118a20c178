"""Where beam search's decoder step spends its time, timed directly (no profiler): the step, its products, attention.

bench/probes/beam_step_aot.py's shapes (beam 4 over 16 sources of 18-22 tokens, 64 hypotheses, the small
encoder-decoder, an 8,000-token vocabulary). In one process, alternating for ``--rounds`` rounds, each a
mean over the search's 30 steps:
- ``step``: the eager decoder step as the search runs it (weights laid out for the chosen kernels);
- ``products``: the same step's 19 linear maps alone, called in the step's order on 64-row inputs, with
  the chosen kernels (``products_aten``: ``F.linear`` on every one), so that each streams its weights
  through the caches as it does in the step;
- ``attention``: the step's six attention calls alone (SDPA, as the step calls it): three over the
  self-attention cache (one query a row, 1 to 30 keys) and three grouped over the source (four queries
  a sentence, up to 22 keys).
A profiler's per-call overhead inflates ops this small (it put an attention call at ~320 us); these are
wall times of the calls themselves.

    python bench/probes/beam_step_parts.py [--rounds 5] [--out bench/results/beam_step_parts.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes beside it, and bench/'s common and peers
from beam_step_aot import BEAM, NEW, first_step, model_and_sources  # noqa: E402
from common import write_result  # noqa: E402

from qkv.accel.kernels import step_linears  # noqa: E402


@torch.no_grad()
def step_ms(model, src, src_mask) -> float:
    decoder = first_step(model, src, src_mask, packed=True)
    tokens = torch.full((src.shape[0] * BEAM, 1), 5)
    t0 = time.perf_counter()
    for _ in range(NEW):
        decoder.decode(tokens, None, src_mask)
    return 1000 * (time.perf_counter() - t0) / NEW


@torch.no_grad()
def products_ms(model, src, src_mask, packed: bool) -> float:
    linears = step_linears(first_step(model, src, src_mask, packed=packed))  # laid out as the search lays them out (or not)
    xs = {n: torch.randn(src.shape[0] * BEAM, 1, n) for n in {m.in_features for m in linears}}
    for m in linears:
        m(xs[m.in_features])
    t0 = time.perf_counter()
    for _ in range(NEW):
        for m in linears:
            m(xs[m.in_features])
    return 1000 * (time.perf_counter() - t0) / NEW


@torch.no_grad()
def attention_ms(model, src_mask) -> float:
    cfg = model.cfg
    b, heads = src_mask.shape[0], cfg.n_heads
    dh, layers = cfg.d_model // heads, cfg.n_layers
    rows = b * BEAM
    cache_k, cache_v = torch.randn(rows, heads, NEW + 2, dh), torch.randn(rows, heads, NEW + 2, dh)
    memory_k, memory_v = torch.randn(b, heads, src_mask.shape[-1], dh), torch.randn(b, heads, src_mask.shape[-1], dh)
    q_self, q_cross = torch.randn(rows, heads, 1, dh), torch.randn(b, heads, BEAM, dh)  # (N K, H, 1, Dh), grouped
    t0 = time.perf_counter()
    for t in range(1, NEW + 1):
        for _ in range(layers):
            F.scaled_dot_product_attention(q_self, cache_k[:, :, :t + 1], cache_v[:, :, :t + 1])
            F.scaled_dot_product_attention(q_cross, memory_k, memory_v, attn_mask=src_mask)
    return 1000 * (time.perf_counter() - t0) / NEW


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/beam_step_parts.json")
    args = ap.parse_args()
    model, src, src_mask = model_and_sources()
    parts = {
        "step": lambda: step_ms(model, src, src_mask),
        "products": lambda: products_ms(model, src, src_mask, packed=True),
        "products_aten": lambda: products_ms(model, src, src_mask, packed=False),
        "attention": lambda: attention_ms(model, src_mask),
    }
    for part in parts.values():  # untimed: the kernels chosen (or read from the cache), everything warm
        part()
    runs: dict[str, list[float]] = {name: [] for name in parts}
    for r in range(args.rounds):
        for name, part in parts.items():
            runs[name].append(part())
        print(f"[{r + 1}/{args.rounds}]", {name: round(ms[-1], 2) for name, ms in runs.items()}, file=sys.stderr)
    summary = {f"{name}_ms": statistics.median(ms) for name, ms in runs.items()}
    flop = sum(2 * src.shape[0] * BEAM * m.in_features * m.out_features for m in step_linears(model))
    summary["products_gflops"] = flop / summary["products_ms"] / 1e6
    summary["rest_of_step_ms"] = summary["step_ms"] - summary["products_ms"] - summary["attention_ms"]
    write_result(args.out, {"benchmark": "beam search's decoder step (64 hypotheses, small model) and its parts "
                                         "timed directly, ms a step", "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
