"""Training speed and memory of qkv's GPT against HF GPT2LMHeadModel, side by side in one run.

The nanoGPT shakespeare-char config (6 layers, 6 heads, d_model 384, context 256, vocab 65), dropout 0,
batch 8, forward + backward + AdamW (the same fused torch AdamW for both), fp32, on random tokens.
Workers run in fresh processes, alternating; see bench/common.py.

    python bench/train_gpt.py [--repeats 5] [--steps 15] [--out bench/results/train_gpt.json]
    python bench/train_gpt.py --impls qkv,nanogpt,hf --bias --nanogpt-dir PATH   # with nanoGPT's own model.py
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    matmul_peak_gflops, median_of, run_alternating, time_training, training_bench_args, write_result,
)

VOCAB, CONTEXT, BATCH = 65, 256, 8


def build(impl: str, bias: bool = False, nanogpt_dir: str = ""):
    """The model and a function (x, y) -> loss, for one implementation."""
    import torch.nn.functional as F

    if impl == "qkv":
        from qkv import GPT, preset
        from qkv.devices import keep_freed_memory

        keep_freed_memory()  # as every qkv trainer's start does
        model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0, bias=bias))
        return model, lambda x, y: F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    if impl == "nanogpt":  # nanoGPT's own model.py, from a checkout of karpathy/nanoGPT (not part of qkv)
        if not nanogpt_dir or not os.path.isfile(os.path.join(nanogpt_dir, "model.py")):
            raise SystemExit("the nanogpt peer needs --nanogpt-dir DIR holding nanoGPT's model.py")
        sys.path.insert(0, nanogpt_dir)
        from model import GPT as NanoGPT, GPTConfig  # noqa: N811

        model = NanoGPT(GPTConfig(block_size=CONTEXT, vocab_size=VOCAB, n_layer=6, n_head=6, n_embd=384,
                                  dropout=0.0, bias=bias))
        return model, lambda x, y: model(x, y.contiguous())[1]  # its forward computes the same cross-entropy
    if impl == "hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=VOCAB, n_positions=CONTEXT, n_embd=384, n_layer=6, n_head=6, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa",
        )
        model = GPT2LMHeadModel(cfg)
        assert model.config._attn_implementation == "sdpa"
        return model, lambda x, y: F.cross_entropy(model(input_ids=x).logits.reshape(-1, VOCAB), y.reshape(-1))
    raise ValueError(f"unknown implementation {impl!r}")


def worker(args) -> dict:
    import torch

    impl, steps, warmup = args.worker, args.steps, args.warmup

    torch.manual_seed(0)
    model, loss_fn = build(impl, args.bias, args.nanogpt_dir)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    data = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), generator=torch.Generator().manual_seed(0))
    times, memory = time_training(opt, loss_fn, lambda: (data[:, :-1], data[:, 1:]), steps, warmup)
    return {
        "impl": impl, "tokens_per_s": BATCH * CONTEXT / statistics.median(times), **memory,
        "params": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    def options(ap):
        ap.add_argument("--bias", action="store_true", help="biases in qkv's and nanoGPT's linear maps and norms "
                                                             "(HF GPT-2 always has them)")
        ap.add_argument("--nanogpt-dir", default=os.environ.get("NANOGPT_DIR", ""),
                        help="a checkout of karpathy/nanoGPT, for the nanogpt peer (its model.py, run as is)")

    args = training_bench_args(__doc__, "qkv,hf", "bench/results/train_gpt.json", 15, worker, options)

    from qkv import preset
    from qkv.models import flops_per_token

    peaks = [matmul_peak_gflops()]
    runs = run_alternating(__file__, args.impls, args.repeats, args.worker_args)
    peaks.append(matmul_peak_gflops())
    peak = statistics.median(peaks)
    fpt = flops_per_token(preset("nanogpt-shakespeare-char"), CONTEXT)["training"]
    summary = {}
    for impl, rs in runs.items():
        tps = median_of(rs, "tokens_per_s")
        summary[impl] = {
            "tokens_per_s_median": tps,
            "peak_rss_mb_median": median_of(rs, "peak_rss_mb"),
            "training_rss_mb_median": median_of(rs, "training_rss_mb"),
            "params": rs[0]["params"],
            "model_gflops_per_s": tps * fpt / 1e9,
            "fraction_of_matmul_peak": tps * fpt / (peak * 1e9),
        }
    result = {
        "benchmark": "GPT training, nanoGPT shakespeare-char config, dropout 0, batch 8, fwd+bwd+AdamW, fp32",
        "matmul_peak_gflops": peak, "training_flops_per_token": fpt, "summary": summary,
    }
    if "qkv" in summary and "nanogpt" in summary:
        result["ratio_qkv_over_nanogpt"] = summary["qkv"]["tokens_per_s_median"] / summary["nanogpt"]["tokens_per_s_median"]
    if "qkv" in summary and "hf" in summary:
        q, h = summary["qkv"], summary["hf"]
        result["ratios_qkv_over_hf"] = {
            "tokens_per_s": q["tokens_per_s_median"] / h["tokens_per_s_median"],
            "peak_rss": q["peak_rss_mb_median"] / h["peak_rss_mb_median"],
            "training_rss": q["training_rss_mb_median"] / h["training_rss_mb_median"],
        }
    result["runs"] = runs
    write_result(args.out, result)


if __name__ == "__main__":
    main()
