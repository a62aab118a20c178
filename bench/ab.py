"""A/B of two commits of qkv on one benchmark: the same worker, in fresh processes, alternating before/after.

Each round runs ``bench/BENCH.py --worker IMPL`` once from a checkout of the commit before and once
from this checkout (the order alternates round by round), each in its own process with its own tree
first on ``PYTHONPATH``; the report is the median of each side and their ratio. The commit before is
checked out with ``git worktree`` into a temporary folder (or give ``--before-tree``).

    python bench/ab.py --before edf2f21 --bench beam_mt --impl qkv --rounds 10 --metric sentences_per_s \\
        -- --reps 3
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

ROOT = Path(__file__).resolve().parents[1]


def worker(tree: Path, bench: str, impl: str, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(tree / "bench" / f"{bench}.py"), "--worker", impl, *extra],
                         capture_output=True, text=True, cwd=tree, env=env)
    if out.returncode:
        sys.exit(f"{tree}: {bench} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="the commit before (a git revision)")
    ap.add_argument("--before-tree", help="an existing checkout of it instead")
    ap.add_argument("--bench", required=True, help="train_gpt, train_mt, generate_gpt, beam_mt")
    ap.add_argument("--impl", default="qkv")
    ap.add_argument("--metric", default="tokens_per_s")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="-- then the worker's own options")
    args = ap.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    if not args.before_tree and not args.before:
        sys.exit("give --before REV or --before-tree PATH")
    made = None
    if args.before_tree:
        before = Path(args.before_tree)
    else:
        made = Path(tempfile.mkdtemp(prefix="qkv-ab-")) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(made), args.before], check=True,
                       capture_output=True)
        before = made
    sides = {"before": before, "after": ROOT}
    values: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:
                res = worker(sides[side], args.bench, args.impl, extra)
                values[side].append(res[args.metric])
                print(f"[{r + 1}/{args.rounds}] {side:6s} {args.metric} {res[args.metric]:.2f}", file=sys.stderr)
    finally:
        if made is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(made)], capture_output=True)
    med = {side: statistics.median(v) for side, v in values.items()}
    result = {"bench": args.bench, "impl": args.impl, "metric": args.metric, "worker_args": extra,
              "before": args.before or str(before), "rounds": args.rounds,
              "median_before": med["before"], "median_after": med["after"], "ratio_after_over_before": med["after"] / med["before"],
              "values": values}
    print(json.dumps({k: v for k, v in result.items() if k != "values"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
