"""KV-cache generation speed of qkv's GPT against HF ``generate()`` with its cache, side by side in one run.

The nanoGPT shakespeare-char config (6 layers, 6 heads, d_model 384, context 256, vocab 65) with random
weights, a 16-token prompt, 200 new tokens, greedy (both forced to produce all 200: no end token), at
batch 1 and batch 8; qkv with and without its cache, and with each of its product kernels forced
everywhere instead of measured per shape (``qkv-aten``, ``qkv-transposed``, ``qkv-onednn``,
``qkv-mkl``: what the choice is worth), and at batch 1 with its
step compiled by torch.compile (``qkv-compile``; the compile is the untimed first call, whose time is
recorded as ``first_call_s``; larger batches run eagerly under compile=True), against HF compiled the
same way as HF documents it (``hf-compile``: a static cache and a compiled forward); ``qkv-int8``
(``--quantize int8``: PyTorch's dynamic quantization) and CTranslate2 4.8.5 on the same weights
(``ct2``: exported as ``qkv export ctranslate2`` does, fp32; ``ct2-int8``: its int8 compute type),
given the same threads as torch. fp32 unless named, eval mode, torch.inference_mode for all.
``qkv-aot`` runs the step compiled ahead of time for the batch size (qkv.accel.precompiled, as
``qkv generate`` does once ``--precompile`` built it): the packages are built first, in a user cache of
the run's own, their build times recorded.
``qkv-default`` is ``qkv.generate`` called without ``compile=`` and ``qkv-completer`` the Completer
(``qkv generate``'s loop, text in and streamed text out): both on the one default policy (qkv.generation.policy.StepPolicy),
which loads the package where it was built (with ``qkv-aot`` in the run) and decodes eagerly otherwise.
``floor`` is the time of the layers' weight products alone, one product per weight and step on the
kernels qkv chooses: what qkv's eager step costs before attention, norms, activations and Python.

    python bench/generate_gpt.py [--repeats 5] [--out bench/results/generate_gpt.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    ctranslate2_folder, linear_backend_for, median_of, peer_threads, run_alternating, time_steps, write_result,
)

VOCAB, CONTEXT, PROMPT, NEW = 65, 256, 16, 200


def hf_gpt():
    """HF's GPT-2 at the nanoGPT shakespeare-char config, random weights, eval mode, SDPA attention."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=384, n_layer=6, n_head=6, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval()


def worker(impl: str, batch: int, reps: int) -> dict:
    import torch

    torch.manual_seed(0)
    prompt = torch.randint(1, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(0))
    model_kind = linear_backend_for(impl)  # qkv-aten builds qkv, on F.linear
    if model_kind in ("qkv", "qkv-nocache", "qkv-compile", "qkv-int8", "qkv-aot", "qkv-default"):
        from qkv import GPT, generate, preset
        from qkv.accel.precompiled import find
        from qkv.accel.quantize import quantized

        model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
        if impl == "qkv-int8":
            model = quantized(model)
        use_cache = impl != "qkv-nocache"
        # Eager steps, torch.compile's, or (qkv-aot, qkv-default) the default policy of qkv.generate and qkv
        # generate alike: the package where one was built, eager otherwise.
        compile_ = {"qkv-compile": True, "qkv-aot": None, "qkv-default": None}.get(impl, False)
        assert impl != "qkv-aot" or find(model, batch) is not None, "the package was built before the workers"

        def run():
            out = generate(model, prompt, NEW, temperature=0, use_cache=use_cache, compile=compile_)
            assert all(len(o) == NEW for o in out)
    elif impl == "qkv-completer":  # qkv generate's path: text in, text out, the default policy, streamed
        import io
        from types import SimpleNamespace

        from qkv import GPT, Completer, preset
        from qkv.tokenizers.char import CharTokenizer

        chars = CharTokenizer([chr(c) for c in range(32, 32 + VOCAB - 4)])  # + <pad> <bos> <eos> <unk>
        # Its <eos> taken away, as the other workers': all 200 tokens are generated.
        tokenizer = SimpleNamespace(encode=chars.encode, decode=chars.decode, eos_id=None, bos_id=chars.bos_id,
                                    pad_id=chars.pad_id)
        completer = Completer(GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval(), tokenizer)
        text = chars.decode([max(i, 4) for i in prompt[0].tolist()])  # the prompt's ids, outside the specials
        assert batch == 1, "qkv generate streams one prompt"

        def run():
            completer.complete(text, max_new_tokens=NEW, temperature=0, stream=io.StringIO())
    elif impl in ("hf", "hf-compile"):
        model = hf_gpt()
        mask = torch.ones_like(prompt)
        static = {}
        if impl == "hf-compile":  # HF's recipe for compiled decoding: a static cache and a compiled forward
            model.compile(fullgraph=True, dynamic=False)
            static = {"cache_implementation": "static"}

        def run():
            out = model.generate(prompt, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                 use_cache=True, eos_token_id=None, pad_token_id=0, **static)
            assert out.shape[1] == PROMPT + NEW
    elif impl in ("ct2", "ct2-int8"):
        import ctranslate2

        from qkv import GPT, preset

        folder = ctranslate2_folder(GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval())
        ct2 = ctranslate2.Generator(folder, device="cpu", compute_type="int8" if impl == "ct2-int8" else "float32",
                                    inter_threads=1, intra_threads=peer_threads())
        start = [[f"t{i}" for i in row] for row in prompt.tolist()]

        def run():
            out = ct2.generate_batch(start, max_length=NEW, min_length=NEW, sampling_topk=1,
                                     include_prompt_in_result=False)
            assert all(len(r.sequences[0]) == NEW for r in out)
    elif impl == "floor":
        from qkv import GPT, preset
        from qkv.accel.kernels import decoding_model, step_linears

        model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
        layers = step_linears(decoding_model(model, batch, PROMPT + NEW))  # the step's maps as decoding lays them out
        inputs = [torch.randn(batch, m.in_features) for m in layers]

        def run():
            for _ in range(NEW):
                for m, x in zip(layers, inputs):
                    m(x)
    else:
        raise ValueError(impl)
    with torch.inference_mode():
        first = time_steps(run, 1, warmup=0)[0]  # untimed warm-up; for qkv-compile, the compile
        times = time_steps(run, reps, warmup=0)
    return {"impl": impl, "batch": batch, "tokens_per_s": batch * NEW / statistics.median(times),
            "ms_per_step": 1000 * statistics.median(times) / NEW, "first_call_s": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds of fresh processes")
    ap.add_argument("--reps", type=int, default=3, help="timed generations per process")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--impls", default="qkv,hf,ct2,qkv-compile,qkv-int8,ct2-int8,hf-compile,qkv-aten,qkv-transposed,"
                                        "qkv-onednn,qkv-mkl,"
                                        "qkv-nocache,floor")
    ap.add_argument("--out", default="bench/results/generate_gpt.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.batch, args.reps)))
        return
    result = {"benchmark": "GPT generation, nanoGPT shakespeare-char config, 16-token prompt, 200 new tokens, greedy",
              "by_batch": {}}
    all_runs = {}
    with tempfile.TemporaryDirectory() as cache:  # qkv-aot's packages, in a user cache of the run's own
        if "qkv-aot" in args.impls.split(","):  # qkv-default and qkv-completer then load them too
            result["aot_build_s"] = build_packages(cache, [int(b) for b in args.batches.split(",")])
        measure(args, result, all_runs)
    result["runs"] = all_runs
    write_result(args.out, result)


def build_packages(cache: str, batches: list[int]) -> dict[str, float]:
    """The step of the workers' model compiled ahead of time for each batch size; the seconds each took."""
    import torch

    from qkv import GPT, preset
    from qkv.accel.kernels import CACHE_ENV, cache_path
    from qkv.accel.precompiled import precompile

    os.environ[CACHE_ENV] = str(cache_path())  # the kernels chosen before on this machine, kept
    os.environ["XDG_CACHE_HOME"] = cache  # the workers inherit both
    torch.manual_seed(0)  # the workers' model, weight for weight
    model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
    return {str(b): precompile(model, b)[1] for b in batches}


def measure(args: argparse.Namespace, result: dict, all_runs: dict) -> None:
    for batch in (int(b) for b in args.batches.split(",")):
        # torch.compile's step and qkv generate's streamed loop: batch 1 only
        impls = [i for i in args.impls.split(",") if batch == 1 or not i.endswith(("-compile", "-completer"))]
        runs = run_alternating(__file__, impls, args.repeats, ["--batch", str(batch), "--reps", str(args.reps)])
        summary = {impl: {"tokens_per_s_median": median_of(rs, "tokens_per_s"), "ms_per_step_median": median_of(rs, "ms_per_step")}
                   for impl, rs in runs.items()}
        if "qkv" in summary and "hf" in summary:
            summary["ratio_qkv_over_hf"] = summary["qkv"]["tokens_per_s_median"] / summary["hf"]["tokens_per_s_median"]
        for impl in ("qkv-compile", "hf-compile"):
            if impl in summary:
                summary[impl]["first_call_s_median"] = median_of(runs[impl], "first_call_s")
        if "qkv-compile" in summary:
            for peer in ("hf", "hf-compile"):
                if peer in summary:
                    summary[f"ratio_qkv_compile_over_{peer.replace('-', '_')}"] = (
                        summary["qkv-compile"]["tokens_per_s_median"] / summary[peer]["tokens_per_s_median"])
        for ours, peer in (("qkv", "ct2"), ("qkv-compile", "ct2"), ("qkv-int8", "ct2-int8"), ("ct2", "hf"),
                           ("qkv-aot", "ct2"), ("qkv-aot", "hf"), ("qkv-default", "hf"), ("qkv-completer", "hf"),
                           ("qkv-default", "qkv-completer")):
            if ours in summary and peer in summary:
                summary[f"ratio_{ours.replace('-', '_')}_over_{peer.replace('-', '_')}"] = (
                    summary[ours]["tokens_per_s_median"] / summary[peer]["tokens_per_s_median"])
        if "qkv-aten" in summary and "hf" in summary:
            summary["ratio_qkv_aten_over_hf"] = summary["qkv-aten"]["tokens_per_s_median"] / summary["hf"]["tokens_per_s_median"]
        if "floor" in summary and "hf" in summary:  # the most eager qkv could gain on HF here
            summary["ratio_floor_over_hf"] = summary["floor"]["tokens_per_s_median"] / summary["hf"]["tokens_per_s_median"]
        if "qkv" in summary and "qkv-nocache" in summary:
            summary["ratio_cache_over_nocache"] = (summary["qkv"]["tokens_per_s_median"]
                                                   / summary["qkv-nocache"]["tokens_per_s_median"])
        result["by_batch"][str(batch)] = summary
        all_runs[str(batch)] = runs


if __name__ == "__main__":
    main()
