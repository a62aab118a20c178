"""Training speed and memory of qkv's GPT against HF GPT2LMHeadModel, side by side in one run.

The nanoGPT shakespeare-char config (6 layers, 6 heads, d_model 384, context 256, vocab 65), dropout 0,
batch 8, forward + backward + AdamW, fp32. Each (implementation, repeat) runs in its own fresh process
so that peak resident memory is that implementation's alone; the runs alternate (ours, HF, ours, HF,
...) so that drift on a shared machine hits both alike, and the report quotes medians and ratios.

    python bench/train_gpt.py [--repeats 3] [--steps 20] [--out bench/results/train_gpt.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

CONFIG = dict(vocab_size=65, n_layers=6, n_heads=6, d_model=384, context=256, batch=8)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(impl: str):
    import torch

    c = CONFIG
    if impl == "qkv":
        from qkv import GPT, preset

        model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0))

        def loss_fn(x, y):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
    elif impl == "hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        hf_cfg = GPT2Config(
            vocab_size=c["vocab_size"], n_positions=c["context"], n_embd=c["d_model"], n_layer=c["n_layers"],
            n_head=c["n_heads"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
        )
        model = GPT2LMHeadModel(hf_cfg)
        assert model.config._attn_implementation == "sdpa", model.config._attn_implementation

        def loss_fn(x, y):
            return torch.nn.functional.cross_entropy(model(input_ids=x).logits.view(-1, c["vocab_size"]), y.reshape(-1))
    else:
        raise ValueError(impl)
    return model, loss_fn


def worker(impl: str, steps: int, warmup: int) -> dict:
    import torch

    torch.manual_seed(0)
    model, loss_fn = build(impl)
    model.train()
    # The same optimizer for both: AdamW (fused where this torch supports it on CPU).
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    c = CONFIG
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, c["vocab_size"], (steps + warmup, c["batch"], c["context"] + 1), generator=g)
    rss_before = rss_mb()
    times = []
    for i in range(steps + warmup):
        x, y = data[i, :, :-1], data[i, :, 1:]
        t0 = time.perf_counter()
        loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    tokens = c["batch"] * c["context"]
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "impl": impl, "tokens_per_s": tokens / statistics.median(times), "step_s_median": statistics.median(times),
        "peak_rss_mb": peak_rss_mb(), "rss_before_training_mb": rss_before, "params": n_params,
        "loss_last": float(loss),
    }


def matmul_peak_gflops(n: int = 1024, reps: int = 20) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / min(times) / 1e9


def model_flops_per_token() -> float:
    """Training FLOPs per token: 6 per weight (fwd + bwd) + attention 12 * L * T * D (PaLM appendix B)."""
    from qkv import preset
    from qkv.models import flops_per_token

    return flops_per_token(preset("nanogpt-shakespeare-char"), CONFIG["context"])["training"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--impls", default="qkv,hf")
    ap.add_argument("--out", default="bench/results/train_gpt.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.warmup)))
        return

    import torch

    impls = args.impls.split(",")
    runs: dict[str, list[dict]] = {i: [] for i in impls}
    peaks = [matmul_peak_gflops()]
    for r in range(args.repeats):
        for impl in impls:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", impl, "--steps", str(args.steps), "--warmup", str(args.warmup)],
                capture_output=True, text=True,
            )
            if out.returncode:
                sys.exit(f"{impl} worker failed:\n{out.stderr}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs[impl].append(res)
            print(f"[{r + 1}/{args.repeats}] {impl:4s} {res['tokens_per_s']:8.0f} tok/s  peak RSS "
                  f"{res['peak_rss_mb']:7.0f} MB", file=sys.stderr)
        peaks.append(matmul_peak_gflops())
    peak = statistics.median(peaks)
    fpt = model_flops_per_token()
    summary = {}
    for impl, rs in runs.items():
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        summary[impl] = {
            "tokens_per_s_median": tps,
            "peak_rss_mb_median": statistics.median(r["peak_rss_mb"] for r in rs),
            "training_rss_mb_median": statistics.median(r["peak_rss_mb"] - r["rss_before_training_mb"] for r in rs),
            "params": rs[0]["params"],
            "model_tflops": tps * fpt / 1e12,
            "fraction_of_matmul_peak": tps * fpt / (peak * 1e9),
        }
    result = {
        "benchmark": "GPT training, nanoGPT shakespeare-char config, dropout 0, batch 8, fwd+bwd+AdamW, fp32",
        "command": "python bench/train_gpt.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {torch.get_num_threads()}",
        "matmul_peak_gflops_median": peak,
        "training_flops_per_token": fpt,
        "summary": summary,
        "runs": runs,
    }
    if "qkv" in summary and "hf" in summary:
        result["ratio_tokens_per_s_qkv_over_hf"] = summary["qkv"]["tokens_per_s_median"] / summary["hf"]["tokens_per_s_median"]
        result["ratio_peak_rss_qkv_over_hf"] = summary["qkv"]["peak_rss_mb_median"] / summary["hf"]["peak_rss_mb_median"]
        result["ratio_training_rss_qkv_over_hf"] = summary["qkv"]["training_rss_mb_median"] / summary["hf"]["training_rss_mb_median"]
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
