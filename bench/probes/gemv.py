"""What one batch-1 decoding step's weight products cost on each fp32 kernel, against reading the weights.

The 24 weight matrices of the nanoGPT shakespeare-char config (6 layers of W^Q/W^K/W^V stacked
1152x384, W^O 384x384, W_1 1536x384, W_2 384x1536: 43 MB in fp32), each multiplied by one random
vector, as one decoding step at batch 1 does. Kernels, all in one process, alternating, medians:
- ``mkl``: ``torch.mv``, where ``F.linear`` goes for fp32 (and HF with it);
- ``onednn``: oneDNN's linear on weights packed for one row, one of the two kernels qkv's decoding measures;
- ``vecdot``: ``torch.linalg.vecdot(W, x)``, a fused multiply-and-sum over each row;
- ``compiled``: ``(W * x).sum(-1)`` through ``torch.compile`` (skipped with ``--no-compile``);
- ``read``: ``W.sum()`` over the same matrices: streaming the 43 MB with one add per number, the
  cost of memory alone.

    python bench/probes/gemv.py [--rounds 5] [--out bench/results/gemv.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes beside it, and bench/'s common and peers
from common import time_steps, write_result  # noqa: E402

D, FF, LAYERS = 384, 1536, 6


def kernels(compile_: bool) -> tuple[list, dict]:
    import torch

    from torch import nn

    from qkv.accel.kernels import PackedLinear

    g = torch.Generator().manual_seed(0)
    shapes = [(3 * D, D), (D, D), (FF, D), (D, FF)] * LAYERS  # (out, in), as nn.Linear stores them
    weights = [torch.randn(*s, generator=g) for s in shapes]
    inputs = [torch.randn(w.shape[1], generator=g) for w in weights]
    packed = []
    for w in weights:
        layer = nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            layer.weight.copy_(w)
        packed.append(PackedLinear.of(layer, 1))  # oneDNN's product on the layer's weight, packed for one row
    found = {
        "mkl": lambda: [torch.mv(w, x) for w, x in zip(weights, inputs)],
        "onednn": lambda: [m(x[None]) for m, x in zip(packed, inputs)],
        "vecdot": lambda: [torch.linalg.vecdot(w, x) for w, x in zip(weights, inputs)],
        "read": lambda: [w.sum() for w in weights],
    }
    if compile_:
        multiply_and_sum = torch.compile(lambda w, x: (w * x).sum(-1), dynamic=False)
        found["compiled"] = lambda: [multiply_and_sum(w, x) for w, x in zip(weights, inputs)]
    return weights, found


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds over the kernels")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per kernel and round")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile kernel")
    ap.add_argument("--out", default="bench/results/gemv.json")
    args = ap.parse_args()

    with torch.inference_mode():
        weights, found = kernels(not args.no_compile)
        reference = found["mkl"]()
        for name, run in found.items():  # every product kernel computes the same products
            if name != "read":
                for got, want in zip(run(), reference):
                    torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-4, atol=1e-3)
        times: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(args.rounds):
            for name, run in found.items():
                times[name].append(statistics.median(time_steps(run, args.steps, warmup=5)))
    megabytes = sum(w.numel() * 4 for w in weights) / 1e6
    summary = {name: {"ms_median": 1000 * statistics.median(ts), "gb_per_s": megabytes / 1000 / statistics.median(ts)}
               for name, ts in times.items()}
    write_result(args.out, {"benchmark": f"one batch-1 decoding step's weight products, {megabytes:.1f} MB fp32",
                            "megabytes": megabytes, "summary": summary, "runs": {k: [1000 * t for t in v]
                                                                                   for k, v in times.items()}})


if __name__ == "__main__":
    main()
