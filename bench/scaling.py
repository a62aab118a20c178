"""CPU scaling of data-parallel training: one process with 2 threads against 2 ranks of one thread (gloo).

The same recipe (the same global batch) on each layout, in fresh processes, alternating round by round:

- ``1x2``: one process, no DDP, 2 threads (``train.threads=2``);
- ``2x1``: ``--nproc-per-node 2``, each rank one thread, each taking half of every batch;
- ``1x1``: one process, no DDP, one thread; and ``ddp1``: one rank under torchrun (DDP at world size 1),
  one thread: their ratio is the overhead of DDP itself.

The figure is training tokens per second of the optimizer steps (``train_seconds`` of the run: the
evaluations are not counted); the report gives each layout's median and its ratio to ``1x2``.

    python bench/scaling.py --rounds 3 --out bench/results/scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = {"1x2": (0, 2), "2x1": (2, 1), "1x1": (0, 1), "ddp1": (1, 1)}  # (launcher ranks, threads per process)

JOBS = {
    # nanoGPT's CPU baby recipe: 12 windows of 64 characters a step.
    "gpt": ["train", "lm", "--recipe", "baby", "train.steps=150", "train.eval_every=1000", "train.eval_iters=2",
            "train.log_every=10"],
    # The demo's translation recipe (1,500-token batches): its losses and BLEU are not the point here.
    "mt": ["train", "mt", "--recipe", "demo", "train.steps=120", "train.eval_every=1000", "train.eval_bleu_sentences=0",
           "train.average_last=0", "data.demo_test=16", "train.log_every=10"],
}


def tokens_per_s(job: str, run: Path, steps: int) -> float:
    if job == "gpt":
        summary = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        seconds = summary["train_seconds"]
        return steps * 12 * 64 / seconds
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in rows if r["split"] == "train")


def measure(job: str, layout: str, work: Path) -> float:
    ranks, threads = LAYOUTS[layout]
    run = work / f"{job}-{layout}"
    argv = JOBS[job]
    cmd = [sys.executable, "-m", "qkv", *argv, f"train.threads={threads}", "--run", str(run), "--overwrite", "--quiet"]
    if ranks:
        cmd += ["--nproc-per-node", str(ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"{layout} {job} failed:\n{out.stderr[-3000:]}")
    steps = int(next(a for a in argv if a.startswith("train.steps=")).split("=")[1])
    return tokens_per_s(job, run, steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", nargs="+", default=list(JOBS))
    ap.add_argument("--out", default="bench/results/scaling.json")
    args = ap.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for job in args.jobs:
            samples: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            for r in range(args.rounds):
                order = list(LAYOUTS) if r % 2 == 0 else list(reversed(LAYOUTS))
                for layout in order:
                    samples[layout].append(measure(job, layout, Path(tmp)))
                    print(f"{job} round {r + 1} {layout}: {samples[layout][-1]:,.0f} tokens/s", file=sys.stderr)
            med = {layout: statistics.median(v) for layout, v in samples.items()}
            results[job] = {"tokens_per_s": samples, "median": med,
                            "ratio_2x1_vs_1x2": med["2x1"] / med["1x2"], "ratio_ddp1_vs_1x1": med["ddp1"] / med["1x1"]}
    write_result(args.out, {"rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
