"""Where a generation's time goes, inside one process: before the first token, and each step after it.

bench/ab.py compares two commits by the throughput of fresh processes, whose rounds spread 5-15% on a shared
machine. This probe splits one generation of bench/generate_gpt.py's model and prompt (200 greedy tokens,
batch 1) into the time to its first token (the policy, the decoding model, the prefill) and the median of
the steps after it, over ``--rounds`` generations in one process after an untimed one (which compiles, for
``--how compiled``). It runs on whichever qkv comes first on ``PYTHONPATH``, so that two commits can be
compared with the same probe:

    python bench/probes/generation_overhead.py --how eager|compiled|default [--rounds 5] [--out FILE]
    PYTHONPATH=/path/to/other/checkout python bench/probes/generation_overhead.py --how default

``default`` is ``compile=None``: the package of the step where one was built (``XDG_CACHE_HOME``), else eager.
It also times what a decoding copy of the model costs (``copy_ms``, qkv.accel.swap.decoding_copy, where the qkv
has one) beside ``copy.deepcopy`` of the modules with every tensor kept (``deepcopy_ms``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for its constants
from generate_gpt import NEW, PROMPT, VOCAB  # noqa: E402

import qkv  # noqa: E402
from qkv import GPT, generate, preset  # noqa: E402


def copy_costs(model: torch.nn.Module, times: int = 50) -> dict[str, float | None]:
    """The median ms of a decoding copy of ``model`` (None before qkv had one) and of copy.deepcopy of it."""
    try:
        from qkv.accel.swap import decoding_copy
    except ImportError:  # a commit before the decoding copy
        decoding_copy = None
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}

    def median_ms(make) -> float:
        seconds = []
        for _ in range(times):
            t0 = time.perf_counter()
            make()
            seconds.append(time.perf_counter() - t0)
        return 1000 * statistics.median(seconds)

    return {"copy_ms": None if decoding_copy is None else median_ms(lambda: decoding_copy(model)),
            "deepcopy_ms": median_ms(lambda: copy.deepcopy(model, dict(tensors)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--how", choices=["eager", "compiled", "default"], default="eager")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    compile_ = {"eager": False, "compiled": True, "default": None}[args.how]
    torch.manual_seed(0)  # bench/generate_gpt.py's model, weight for weight
    model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
    prompt = torch.randint(1, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    first, steps, totals = [], [], []
    with torch.inference_mode():
        generate(model, prompt, NEW, temperature=0, compile=compile_)  # untimed: kernels chosen, step compiled
        for _ in range(args.rounds):
            stamps: list[float] = []
            t0 = time.perf_counter()
            generate(model, prompt, NEW, temperature=0, compile=compile_, on_step=lambda tok: stamps.append(time.perf_counter()))
            totals.append(time.perf_counter() - t0)
            first.append(stamps[0] - t0)
            steps.append(statistics.median(b - a for a, b in zip(stamps, stamps[1:])))
    result = {"how": args.how, **copy_costs(model), "qkv": os.path.dirname(qkv.__file__), "rounds": args.rounds,
              "first_token_ms": [1000 * s for s in first], "step_median_ms": [1000 * s for s in steps],
              "generation_ms": [1000 * s for s in totals]}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
