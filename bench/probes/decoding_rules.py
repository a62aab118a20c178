"""The figures behind the rules of qkv/accel/ (and two beside them), measured again on the machine at hand.

docs/BENCHMARKS.md ("The figures behind the decoding rules") quotes what each rule was chosen by; this probe
measures what one process can of them, and writes them as JSON:

- ``products``: each step product's time on each kernel at the nanoGPT config, for 1 and 8 rows, as
  ``qkv.accel.kernels.measure`` times them when it chooses (``F.linear`` on the weight as ``nn.Linear``
  keeps it, the same values laid out (in, out), oneDNN's and MKL's packed weights), and the seconds the
  measurement of a step's kernels takes at the nanoGPT config and at the paper's base size;
- ``wrapper``: what a Python ``nn.Module`` around ``F.linear`` adds to a batch-1 product of a step's size;
- ``packing``: the memory of a step's weights packed for one row count, and for every count from 1 to 16;
- ``optimizer``: one AdamW update of 8.3M parameters (a small Transformer's shapes), fused against foreach;
- ``half``: a (256, 1024) x (1024, 1024) product, and a training step of the nanoGPT config, in bf16 and
  fp16 against fp32 (``devices.py`` trains in fp32 on a CPU);
- ``compile`` (``--compile``): the first call of a compiled decoding step, with an empty inductor cache and
  with a warm one, and the step's time with qkv's inductor thresholds and with inductor's own (four fresh
  processes; a minute or two).

    OMP_NUM_THREADS=1 python bench/probes/decoding_rules.py [--compile] [--out bench/results/decoding_rules.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes beside it, and bench/'s common and peers
from common import rss_mb, time_steps, write_result  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from qkv import GPT, ModelConfig, preset  # noqa: E402
from qkv.accel import kernels  # noqa: E402


def products() -> dict:
    """Seconds per product of each step shape and kernel (``"in,out"``), for 1 and 8 rows; measuring seconds."""
    out: dict = {}
    for name, cfg in (("nanogpt", preset("nanogpt-shakespeare-char", dropout=0.0)),
                      ("base", ModelConfig(arch="gpt", vocab_size=8000, d_model=512, n_heads=8, d_ff=2048,
                                           n_layers=6, max_len=256, dropout=0.0))):
        torch.manual_seed(0)
        linears = kernels.step_linears(GPT(cfg).eval())
        for rows in (1, 8) if name == "nanogpt" else (1,):
            t0 = time.perf_counter()
            seconds = kernels.measure(linears, rows)
            out[f"{name}_rows{rows}"] = {"measure_s": time.perf_counter() - t0,
                                         "us": {shape: {k: 1e6 * s for k, s in by.items()} for shape, by in seconds.items()}}
    return out


class _Wrapper(nn.Module):
    """A module that calls F.linear itself: a Python forward around the product."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.linear.weight, self.linear.bias)


def wrapper(rounds: int) -> dict:
    """Microseconds a batch-1 product of a (384 -> 1536) linear map takes called directly and through a wrapper."""
    linear = nn.Linear(384, 1536)
    wrapped, x = _Wrapper(linear), torch.randn(1, 1, 384)
    calls = {"linear": lambda: linear(x), "wrapped": lambda: wrapped(x)}
    times = {k: [] for k in calls}
    with torch.no_grad():
        for _ in range(rounds):
            for k, call in calls.items():
                times[k].append(statistics.median(time_steps(call, 2000, warmup=200)))
    us = {k: 1e6 * statistics.median(v) for k, v in times.items()}
    return {**us, "added_us": us["wrapped"] - us["linear"]}


def optimizer(rounds: int) -> dict:
    """Milliseconds one AdamW update of 8.3M parameters (the shapes of a small Transformer) takes, fused and foreach."""
    found = {}
    for kind in ("fused", "foreach"):
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(s)) for s in [(8000, 256), (1024, 256), (256, 1024), (768, 256)] * 3]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, **{kind: True})
        found[kind] = 1000 * statistics.median(
            statistics.median(time_steps(opt.step, 10, warmup=2)) for _ in range(rounds))
    found["parameters"] = sum(p.numel() for p in params)
    return found


def half(rounds: int) -> dict:
    """Milliseconds of a (256, 1024) x (1024, 1024) product in each dtype, and of a training step of the nanoGPT
    config (8 x 64 tokens, forward and backward) in fp32 and under bf16 and fp16 autocast; each over fp32's."""
    found = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, b = torch.randn(256, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        found[f"product_{str(dtype).removeprefix('torch.')}"] = 1000 * statistics.median(
            statistics.median(time_steps(lambda: a @ b, 5, warmup=1)) for _ in range(rounds))
    torch.manual_seed(0)
    model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0))
    idx = torch.randint(0, model.cfg.vocab_size, (8, 64))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        def step() -> None:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss = F.cross_entropy(model(idx).flatten(0, 1).float(), idx.flatten())  # logits (B T, V)
            loss.backward()
        found[f"train_step_{str(dtype).removeprefix('torch.')}"] = 1000 * statistics.median(  # fp16's take seconds
            statistics.median(time_steps(step, 1, warmup=1)) for _ in range(min(rounds, 3)))
    ratios = {f"{kind}_{k}_over_fp32": found[f"{kind}_{k}"] / found[f"{kind}_float32"]
              for kind in ("product", "train_step") for k in ("bfloat16", "float16")}
    return {**found, **ratios}


# A compiled step in a fresh process: its first call, then the median of 100 steps; argv[1] "default" compiles
# it with inductor's own thresholds instead of qkv's (a probe's change of the module constant, read at compile).
FIRST_CALL = """
import json, statistics, sys, time, torch
from qkv import GPT, preset
from qkv.accel import compiled
from qkv.accel.kernels import decoding_model
if sys.argv[1] == "default":
    compiled.INDUCTOR_OPTIONS = {}
torch.manual_seed(0)
model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
decoder = decoding_model(model, 1, model.cfg.max_len, packed=False)
with torch.no_grad():
    decoder(torch.zeros(1, 4, dtype=torch.long))
    step = compiled.CompiledStep(decoder, torch.ones(1, 4, dtype=torch.bool))
    token, times = torch.zeros(1, 1, dtype=torch.long), []
    for slot in range(4, 105):
        t0 = time.perf_counter()
        step(token, torch.full((1, 1), slot), slot)
        times.append(time.perf_counter() - t0)
print(json.dumps({"first_call_s": times[0], "step_ms": 1000 * statistics.median(times[1:])}))
"""


def first_calls() -> dict:
    """A compiled step in fresh processes: the first call with an empty inductor cache and with the warm one, and
    the step's median time with qkv's inductor thresholds and with inductor's own."""
    found = {}
    for options in ("qkv", "default"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            for name in ("cold", "warm"):
                out = subprocess.run([sys.executable, "-c", FIRST_CALL, options], capture_output=True, text=True,
                                     env=env, check=True)
                found[f"{options}_{name}"] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def packing() -> dict:
    """Megabytes that the nanoGPT step's weights packed by oneDNN take for one row count, and for each of 1..16
    (what packing for every row count a beam search passes through would hold)."""
    torch.manual_seed(0)
    linears = kernels.step_linears(GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval())
    if not kernels.available("onednn"):
        return {"skipped": "this torch has no oneDNN"}
    before = rss_mb()
    one = [kernels.PackedLinear.of(m, 1, "onednn") for m in linears]
    after_one = rss_mb()
    every = [kernels.PackedLinear.of(m, rows, "onednn") for rows in range(2, 17) for m in linears]
    after_every = rss_mb()
    del one, every
    return {"one_row_count_mb": after_one - before, "row_counts_1_to_16_mb": after_every - before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also the compiled step's first call, cold and warm")
    ap.add_argument("--out", default="bench/results/decoding_rules.json")
    args = ap.parse_args()
    os.environ.setdefault(kernels.CACHE_ENV, os.path.join(tempfile.mkdtemp(), "kernels.json"))  # measure, not read
    result = {"benchmark": "the figures behind the decoding rules (docs/BENCHMARKS.md)",
              "products": products(), "wrapper": wrapper(args.rounds), "optimizer": optimizer(args.rounds),
              "half": half(args.rounds), "packing": packing()}
    if args.compile:
        result["compile"] = first_calls()
    write_result(args.out, result)


if __name__ == "__main__":
    main()
