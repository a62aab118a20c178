"""Where each millisecond of a decoding step goes: weight products, other operations, and time outside any.

One step of each kind of decoding, profiled with torch.profiler after a warm-up: a GPT at the nanoGPT
shakespeare-char config (greedy at batch 1 and 8, sampling with top-k 50 at batch 1) and the
encoder-decoder of bench/beam_mt.py (beam 4 over 16 sources), qkv and HF's on the same
configuration. For each: the wall time of a step (the median of many, unprofiled), the operations
issued from Python per step (top-level ATen/oneDNN/quantized calls), the time in the weight products
among them, the time in the other operations, and the rest: Python, module calls and dispatch,
outside any operation, and attention's share of the other operations. The totals come from the
profiler; the wall time from a plain timed loop. The GPT steps keep the cache at the prompt's 16
positions; "gpt generate" profiles whole generations of bench/generate_gpt.py (the cache growing to
216), per step.

    python bench/probes/step_profile.py [--steps 50] [--out bench/results/step_profile.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes beside it, and bench/'s common and peers
from beam_mt import searches  # noqa: E402
from common import time_steps, write_result  # noqa: E402
from generate_gpt import NEW, PROMPT, VOCAB, hf_gpt  # noqa: E402

PRODUCTS = ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "mkldnn::_linear_pointwise",
            "quantized::linear_dynamic", "mkl::_mkl_linear")
ATTENTION = "aten::scaled_dot_product_attention"  # one of the other operations, reported on its own too


def profile_steps(step, steps: int, per_call: int = 1) -> dict:
    """``step()`` ``steps`` times timed, then ``steps`` times profiled; each call runs ``per_call`` decoding steps."""
    from torch.profiler import ProfilerActivity, profile

    times = time_steps(step, steps, warmup=2 if per_call > 1 else 5)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    top = [e for e in prof.events() if e.cpu_parent is None and "::" in e.name]  # issued from Python
    n = steps * per_call
    product_us = sum(e.cpu_time_total for e in top if e.name in PRODUCTS) / n
    other_us = sum(e.cpu_time_total for e in top if e.name not in PRODUCTS) / n
    attention_us = sum(e.cpu_time_total for e in top if e.name == ATTENTION) / n
    wall_ms = 1000 * statistics.median(times) / per_call
    return {"ms_per_step": wall_ms, "ops_per_step": len(top) / n, "products_ms": product_us / 1000,
            "other_ops_ms": other_us / 1000, "attention_ms": attention_us / 1000,
            "outside_ops_ms": max(0.0, wall_ms - (product_us + other_us) / 1000)}


def gpt_steps(impl: str, batch: int, sample: bool):
    """A function that runs one cached decoding step of a GPT (the cache rewound so it never fills)."""
    import torch

    from qkv.generation.sampling import next_token

    vocab, prompt = VOCAB, 16
    ids = torch.randint(1, vocab, (batch, prompt), generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)
    pick = (lambda logits: next_token(logits, 0.8, 50, None, gen)) if sample else (lambda logits: logits.argmax(-1))
    if impl.startswith("qkv"):
        from qkv import GPT, preset
        from qkv.accel.kernels import decoding_model
        from qkv.accel.quantize import quantized

        model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
        if impl == "qkv-int8":
            model = quantized(model)
        model = decoding_model(model, batch, 256)
        model(ids)
        caches = [layer.self_attn.cache for layer in model.layers]
        tok = torch.randint(1, vocab, (batch, 1))

        def step():
            for c in caches:
                c.length = prompt
            pick(model(tok)[:, -1])
    else:
        model = hf_gpt()
        past = model(ids, use_cache=True).past_key_values
        tok = torch.randint(1, vocab, (batch, 1))
        position = torch.full((batch, 1), prompt)

        def step():
            past.crop(-1)  # drop the position the last step added
            pick(model(tok, past_key_values=past, position_ids=position, use_cache=True).logits[:, -1])
    return step


def gpt_generations(batch: int):
    """A function that runs a whole greedy generation as bench/generate_gpt.py times it (16-token prompt,
    200 new tokens, the default path): the cache grows from 16 to 216 positions, which the steps above keep at 16."""
    import torch

    from qkv import GPT, preset
    from qkv.generation import generate

    model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
    prompt = torch.randint(1, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(0))
    return lambda: generate(model, prompt, NEW, temperature=0), NEW


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--out", default="bench/results/step_profile.json")
    args = ap.parse_args()
    rows = {}
    with torch.inference_mode():
        for label, batch, sample in (("gpt greedy, batch 1", 1, False), ("gpt greedy, batch 8", 8, False),
                                     ("gpt top-k sampling, batch 1", 1, True)):
            for impl in ("qkv", "hf", "qkv-int8"):
                rows[f"{label}: {impl}"] = profile_steps(gpt_steps(impl, batch, sample), args.steps)
                print(f"{label}: {impl}: {rows[f'{label}: {impl}']}", file=sys.stderr)
        for batch in (1, 8):  # a whole generation, per step
            run, per_call = gpt_generations(batch)
            rows[f"gpt generate, batch {batch}: qkv"] = profile_steps(run, 3, per_call=per_call)
            print(f"generate, batch {batch}: {rows[f'gpt generate, batch {batch}: qkv']}", file=sys.stderr)
        for impl, name in (("qkv", "qkv"), ("hf", "marian")):  # a whole search, its encoder included, per step
            rows[f"beam 4, 16 sources: {impl}"] = profile_steps(searches(name, "small"), 3, per_call=31)
            print(f"beam: {impl}: {rows[f'beam 4, 16 sources: {impl}']}", file=sys.stderr)
    write_result(args.out, {"benchmark": "one decoding step, where its time goes", "rows": rows})


if __name__ == "__main__":
    main()
