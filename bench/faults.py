"""A fault campaign: SIGKILL a trainer at random instants, resume it, and compare with a run never killed.

Each case starts ``qkv train lm|mt`` or ``qkv finetune`` on a small recipe that checkpoints often (so kills land inside
checkpoint writes too), kills it at a random instant of its life (start-up, tokenizing, training,
saving, the final evaluation), possibly kills the resumed run again, then resumes until it finishes.
A case *survives* when the final weights (``last`` and ``model``) are bitwise those of the
uninterrupted run and metrics.jsonl holds the same events line for line (clock fields aside); it is
*lost* when a resume fails or anything differs. A kill before the first checkpoint restarts the run
(``--overwrite``): nothing was there to keep.

    python bench/faults.py --job lm --cases 20 --out bench/results/faults_lm.json
    python bench/faults.py --job finetune --cases 15
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 60
CLOCK = ("time", "elapsed", "tokens_per_s", "train_seconds", "seconds")


def recipe(job: str, root: Path) -> list[str]:
    """The command of ``job`` without its run directory (a fine-tuning case first pretrains its base)."""
    if job == "finetune":
        base = recipe("lm", root)
        subprocess.run([sys.executable, "-m", "qkv", *base, "--run", str(root / "base"), "--quiet", "train.steps=60"],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        (root / "sft.jsonl").write_text("".join(
            json.dumps({"prompt": f"All:\n{w}", "response": " Speak."}) + "\n"
            for w in ("Before", "we", "proceed", "any", "further", "hear", "me", "speak")), encoding="utf-8")
        return ["finetune", "--run", str(root / "base"), "--data", str(root / "sft.jsonl"), "train.steps=40",
                "train.warmup=2", "train.eval_every=2", "train.log_every=1", "train.eval_iters=2",
                "train.batch_size=4", "train.mix=0.5", "train.pretrain_batch_size=4"]
    if job == "lm":
        (root / "text.txt").write_text(TEXT, encoding="utf-8")
        (root / "lm.yaml").write_text(f"""
model: {{d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, max_len: 32, dropout: 0.1}}
data: {{path: {root / 'text.txt'}}}
train: {{steps: 150, batch_size: 8, context: 32, eval_every: 50, log_every: 1, eval_iters: 2, warmup: 5,
        checkpoint_every: 2, threads: 1}}
""", encoding="utf-8")
        return ["train", "lm", "--recipe", str(root / "lm.yaml")]
    (root / "mt.yaml").write_text("""
model: {d_model: 32, n_heads: 4, d_ff: 64, n_layers: 1, dropout: 0.1, max_len: 64}
data: {corpus: demo, vocab_size: 150, max_tokens: 300, max_src_len: 40, max_tgt_len: 40, demo_train: 300,
       demo_valid: 16, demo_test: 8}
train: {steps: 40, warmup: 2, peak_lr: 2.0e-3, eval_every: 2, eval_bleu_sentences: 4, log_every: 1,
        keep_checkpoints: 2, average_last: 2, test_beam: 2, threads: 1}
""", encoding="utf-8")
    return ["train", "mt", "--recipe", str(root / "mt.yaml")]


def qkv(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "qkv", *argv, "--quiet"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def events(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in CLOCK} for r in rows]


def same(a: Path, b: Path, name: str) -> bool:
    wa, wb = load_file(str(a / name)), load_file(str(b / name))
    return wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)


def command(base: list[str], run: Path, resume: bool) -> list[str]:
    """``base`` on ``run``: continued (--resume), or started afresh over whatever a kill left (--overwrite)."""
    if base[0] == "finetune":  # its settings are on the command line, and its run is --out
        return [*base, "--out", str(run), "--resume" if resume else "--overwrite"]
    return [*base[:2], "--run", str(run), "--resume"] if resume else [*base, "--run", str(run), "--overwrite"]


def case(base: list[str], ref: Path, run: Path, duration: float, lines: int, rng: random.Random) -> dict:
    kills, killed_fresh = [], 0
    for attempt in range(3):  # at most two kills, then a run to the end
        resume = (run / "last.pt").is_file()
        proc = qkv(command(base, run, resume))
        if attempt < 2 and (attempt == 0 or rng.random() < 0.5):
            if rng.random() < 0.2:  # any instant of its life: start-up, tokenizing, ...
                at = f"{rng.uniform(0.2, duration):.2f}s"
                deadline = time.monotonic() + float(at[:-1])
                while time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.01)
            else:  # ... or a random line of its training: between steps, inside a checkpoint write
                k = rng.randint(1, lines)
                at = f"line {k}"
                metrics = run / "metrics.jsonl"
                while proc.poll() is None and (not metrics.is_file() or metrics.read_bytes().count(b"\n") < k):
                    time.sleep(0.002)
                time.sleep(rng.uniform(0.0, 0.03))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills.append(at)
                killed_fresh += not resume
                continue
        _, stderr = proc.communicate(timeout=600)
        if proc.returncode != 0:
            return {"kills": kills, "survived": False, "why": stderr.strip().splitlines()[-1:]}
        break
    ok_weights = same(ref, run, "last.safetensors") and same(ref, run, "model.safetensors")
    ok_metrics = events(ref) == events(run)
    return {"kills": kills, "kills_of_a_fresh_run": killed_fresh, "weights_equal": ok_weights,
            "metrics_equal": ok_metrics, "survived": ok_weights and ok_metrics}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=["lm", "mt", "finetune"], default="lm")
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="default: bench/results/faults_JOB.json")
    args = ap.parse_args()
    args.out = args.out or f"bench/results/faults_{args.job}.json"
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = recipe(args.job, root)
        t0 = time.perf_counter()
        ref = qkv(command(base, root / "ref", resume=False))
        _, err = ref.communicate()
        if ref.returncode:
            sys.exit(err)
        duration = time.perf_counter() - t0
        results = []
        for i in range(args.cases):
            lines = (root / "ref" / "metrics.jsonl").read_text().count("\n")
            results.append(case(base, root / "ref", root / f"case{i}", duration, lines, rng))
            print(f"case {i}: {results[-1]}", file=sys.stderr)
    report = {"job": args.job, "uninterrupted_seconds": round(duration, 1),
              "cases": len(results), "kills": sum(len(r["kills"]) for r in results),
              "survived": sum(r["survived"] for r in results), "lost": sum(not r["survived"] for r in results),
              "results": results}
    write_result(args.out, report)


if __name__ == "__main__":
    main()
