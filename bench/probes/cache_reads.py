"""Attention of one query over a KV cache that a step's weights have pushed out of the CPU's caches.

In a decoding step the weights stream through the CPU's caches between two attention layers (43 MB at
the nanoGPT config), so each layer's keys and values come from memory. This times, on such a cold
cache, attention of one new position over L cached ones three ways, against reading the same keys
and values once:
- ``sdpa``: ``F.scaled_dot_product_attention``, what qkv's decoding runs;
- ``explicit``: softmax(q k^T / sqrt(d_k)) v written as two matrix products and a softmax;
- ``read``: ``k.sum()`` and ``v.sum()``, the memory traffic alone.
Before each call a 64 MB buffer is summed, which evicts the cache's last level; medians of many calls.
The shapes are those of bench/generate_gpt.py (batch 1 and 8, 6 heads, the cache at the middle and
end of a generation, allocated for the model's 256 positions) and bench/beam_mt.py (64 rows = 16
sources x beam 4, at its last step, allocated for 31 positions; 4 heads small, 8 base).

    python bench/probes/cache_reads.py [--calls 40] [--out bench/results/cache_reads.json]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes beside it, and bench/'s common and peers
from common import write_result  # noqa: E402

# (label, rows, heads, cached positions L, allocated positions)
SHAPES = (("GPT batch 1, L 116", 1, 6, 116, 256), ("GPT batch 8, L 116", 8, 6, 116, 256),
          ("GPT batch 8, L 216", 8, 6, 216, 256), ("beam small, L 30", 64, 4, 30, 31),
          ("beam base, L 30", 64, 8, 30, 31))
HEAD_DIM = 64


def main() -> None:
    import torch
    import torch.nn.functional as F

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--out", default="bench/results/cache_reads.json")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    evict = torch.randn(16 * 1024 * 1024, generator=g)  # 64 MB, beyond the last-level cache

    def cold_us(f) -> float:
        times = []
        for _ in range(args.calls):
            evict.sum()
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return 1e6 * statistics.median(times)

    def explicit(q, k, v):
        scores = torch.matmul(q, k.transpose(-2, -1)).mul_(1 / math.sqrt(q.shape[-1]))  # (B, H, 1, L)
        return torch.matmul(torch.softmax(scores, -1), v)  # (B, H, 1, Dh)

    rows = {}
    with torch.inference_mode():
        for label, b, h, length, allocated in SHAPES:
            k_all, v_all = (torch.randn(b, h, allocated, HEAD_DIM, generator=g) for _ in range(2))
            k, v = k_all[:, :, :length], v_all[:, :, :length]  # (B, H, L, Dh): the filled slots, as KVCache gives them
            q = torch.randn(b, h, 1, HEAD_DIM, generator=g)
            megabytes = 2 * k.numel() * k.element_size() / 1e6
            us = {"sdpa": cold_us(lambda: F.scaled_dot_product_attention(q, k, v)),
                  "explicit": cold_us(lambda: explicit(q, k, v)), "read": cold_us(lambda: (k.sum(), v.sum()))}
            rows[label] = {"megabytes": megabytes, **{f"{name}_us": t for name, t in us.items()},
                           **{f"{name}_gb_per_s": megabytes / t * 1e3 for name, t in us.items()}}
            print(label, {name: round(t) for name, t in us.items()}, file=sys.stderr)
    write_result(args.out, {"benchmark": "attention of one query over a cold KV cache, against reading it",
                            "rows": rows})


if __name__ == "__main__":
    main()
