"""What every benchmark here shares: fresh worker processes run alternately, medians, memory, peak FLOP/s.

Each (implementation, repeat) runs in its own process so that peak resident memory is that
implementation's alone; the runs alternate (A, B, A, B, ...) so that drift on a shared machine hits
both alike; the report quotes medians and ratios, the command, the machine and the date.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable

# A benchmark builds what it times before its workers start (bench/generate_gpt.py's packages): a generation's
# default build in the background (qkv.generation.policy) would take the CPU from the workers it times. The
# workers inherit it.
os.environ.setdefault("QKV_BACKGROUND_PRECOMPILE", "0")


def rss_mb() -> float:
    """Current resident memory of this process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def matmul_peak_gflops(n: int = 1024, reps: int = 20) -> float:
    """fp32 matmul throughput of this machine right now (best of ``reps``): the ceiling for training."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def linear_backend_for(impl: str) -> str:
    """Set up an implementation name's linear kernels and return the model it builds.

    ``qkv`` chooses each product's kernel by measuring it (qkv.accel.kernels); ``qkv-aten`` is qkv
    with its linear maps on PyTorch's default kernels (``F.linear``) everywhere, ``qkv-transposed`` on
    ``F.linear`` with every weight's memory laid out (in, out), ``qkv-onednn`` on oneDNN's packed
    weights, ``qkv-mkl`` on MKL's packed GEMM: run beside ``qkv``, they show what the choice is worth.
    """
    from qkv.accel import kernels

    if impl.startswith("qkv-") and impl[len("qkv-"):] in kernels.KERNELS:
        kernels.set_backend(impl[len("qkv-"):])
        return "qkv"
    return impl


class NumberedVocabulary:
    """A tokenizer's face for a model of random weights: token i is the string ``t<i>`` (the first four: qkv's specials)."""

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def id_to_token(self, i: int) -> str:
        return ("<pad>", "<bos>", "<eos>", "<unk>")[i] if i < 4 else f"t{i}"


def ctranslate2_folder(model, quantization: str | None = None) -> str:
    """``model`` (a qkv Transformer or GPT) written as a CTranslate2 folder the way ``qkv export ctranslate2``
    does, in a temporary folder removed when the process exits (hundreds of MB at the base size, and every
    worker writes one)."""
    import tempfile

    from qkv.interop.ctranslate2 import to_ctranslate2

    spec = to_ctranslate2(model, NumberedVocabulary(model.cfg.vocab_size))
    spec.optimize(quantization=quantization)
    out = tempfile.mkdtemp(prefix="qkv-bench-ct2-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    spec.save(out)
    return out


def peer_threads() -> int:
    """The threads every implementation gets: torch's (``OMP_NUM_THREADS``, else one per core)."""
    import torch

    return torch.get_num_threads()


def time_steps(step: Callable[[], object], steps: int, warmup: int) -> list[float]:
    """Wall time of each of ``steps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def time_training(optimizer, loss_fn: Callable[..., object], next_batch: Callable[[], tuple], steps: int,
                  warmup: int) -> tuple[list[float], dict]:
    """Time forward + backward + optimizer steps on ``next_batch()``; also the memory they take.

    Returns:
        (step times after the warm-up, {"peak_rss_mb", "training_rss_mb": what training added}).
    """

    def step():
        loss = loss_fn(*next_batch())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    before = rss_mb()
    times = time_steps(step, steps, warmup)
    return times, {"peak_rss_mb": peak_rss_mb(), "training_rss_mb": peak_rss_mb() - before}


def run_alternating(script: str, impls: list[str], repeats: int, extra: list[str]) -> dict[str, list[dict]]:
    """Run ``script --worker IMPL *extra`` for each impl, ``repeats`` rounds, alternating; parse its last JSON line."""
    runs: dict[str, list[dict]] = {i: [] for i in impls}
    for r in range(repeats):
        for impl in impls:
            out = subprocess.run([sys.executable, script, "--worker", impl, *extra], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{impl} worker failed:\n{out.stderr}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs[impl].append(res)
            shown = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items() if k != "impl"}
            print(f"[{r + 1}/{repeats}] {impl:8s} {shown}", file=sys.stderr)
    return runs


def bench_args(doc: str, out: str, repeats: int, work: Callable[..., dict], *options: Callable[..., None] | None):
    """The options of a benchmark of alternating worker processes: ``--repeats`` rounds, ``--out``, each of
    ``options(parser)``'s; in a worker process (the hidden ``--worker IMPL``), print ``work(args)`` as JSON
    and exit."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=repeats, help="alternating rounds of fresh processes")
    ap.add_argument("--out", default=out)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    for add in options:
        if add is not None:
            add(ap)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(work(args)))
        sys.exit(0)
    return args


def decoding_bench_args(doc: str, out: str, repeats: int, work: Callable[..., dict], reps_help: str,
                        extra: Callable[..., None] | None = None):
    """:func:`bench_args` with ``--reps``, the timings in each process; ``extra(parser)`` adds the
    benchmark's own options."""
    return bench_args(doc, out, repeats, work, lambda ap: ap.add_argument("--reps", type=int, default=3,
                                                                          help=reps_help), extra)


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def write_result(path: str, result: dict) -> None:
    """Add the command, date and machine, write JSON, print the summary to stdout."""
    import torch

    from qkv.devices import cpu_identity

    result = {
        **result,
        "command": "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{cpu_identity()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads",
    }
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


def training_bench_args(doc: str, impls: str, out: str, steps: int, worker: Callable[..., dict],
                        extra: Callable[..., None] | None = None):
    """Command-line arguments of a training benchmark; in a worker process, run ``worker(args)`` and exit.

    ``extra(parser)`` adds the benchmark's own options; they are passed on to the workers.
    """
    def training(ap) -> None:
        ap.add_argument("--steps", type=int, default=steps, help="timed steps per process")
        ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
        ap.add_argument("--impls", default=impls)
    args = bench_args(doc, out, 5, worker, training, extra)
    # Everything but the orchestration options goes to the workers as given.
    skip = {"--repeats", "--impls", "--out"}
    passed, i, argv = [], 0, sys.argv[1:]
    while i < len(argv):
        key = argv[i].split("=", 1)[0]
        takes_value = "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if key not in skip:
            passed += argv[i:i + 1 + takes_value]
        i += 1 + takes_value
    args.impls = args.impls.split(",")
    args.worker_args = passed
    return args
