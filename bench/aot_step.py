"""A GPT's decoding step compiled ahead of time and loaded, against compiling it in the process and eager.

The compiled step (qkv.accel.compiled) runs a batch-1 token faster than the eager step, but a
fresh process pays seconds before its first compiled token: importing dynamo and inductor, tracing
the model, loading the kernels from inductor's disk cache. qkv.accel.precompiled compiles the
same step ahead of time with AOTInductor (``qkv generate --precompile``), and a later process loads
the package with PyTorch's C++ loader, without importing inductor. This measures both beside eager
decoding and the peers.

The nanoGPT shakespeare-char config (random weights, scaled x3 so that greedy tokens vary), batch 1,
16-token prompt, 200 new tokens, greedy, one thread. The package is built first, in a user cache of
the run's own (its build time recorded), then fresh processes alternate:
- ``eager``: ``generate()``, eager as the default is where no package was built;
- ``jit``: the step compiled in the process by torch.compile (``CompiledStep``; inductor's disk cache
  as the machine has it, warm after a first round);
- ``aot``: the package loaded (``LoadedStep``, what ``qkv generate`` runs once the package exists);
  every step's logits checked against an eager model's afterwards;
- ``completer`` and ``completer-eager``: ``qkv generate``'s own loop (``Completer.complete``, a
  character tokenizer) with the package found and loaded (the default command once a package exists,
  which its first eager generation of 32+ tokens builds in the background), and with ``--no-compile``;
- ``ct2`` and ``hf``: CTranslate2 and HF ``generate`` as bench/generate_gpt.py runs them at batch 1.
``ready_s`` is the time from the model built to the step ready (jit: its first call; aot: the
load), ``first_token_since_start_s`` the time from the process's start (before torch is imported) to
its first new token, ``ms_per_token`` the median step after the first (eager: a whole generation's
mean).

    python bench/aot_step.py [--repeats 3] [--out bench/results/aot_step.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

STARTED = time.perf_counter()  # before torch is imported: what a process pays before its first token

import torch  # noqa: E402

from qkv import GPT, preset  # noqa: E402
from qkv.generation import generate  # noqa: E402
from qkv.accel.compiled import CompiledStep  # noqa: E402
from qkv.generation.completer import Completer  # noqa: E402
from qkv.accel.kernels import CACHE_ENV, cache_path, decoding_model  # noqa: E402
from qkv.accel.precompiled import LoadedStep, cache_slots, package_path, precompile  # noqa: E402
from qkv.tokenizers.char import CharTokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import median_of, run_alternating, write_result  # noqa: E402
from generate_gpt import NEW, PROMPT, VOCAB  # noqa: E402
from generate_gpt import worker as peer_worker  # noqa: E402


def model_and_prompt():
    torch.manual_seed(0)
    model = GPT(preset("nanogpt-shakespeare-char", dropout=0.0)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)  # random weights whose greedy tokens vary, so that a wrong cache shows
    prompt = torch.randint(1, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    return model, prompt


def prepared(model, prompt, slots: int):
    """The decoding model with caches of ``slots`` positions and the prompt prefilled, as a compiled step needs
    them (torch.compile's: the model's context; the package's: ``cache_slots``), the first new token and the
    prompt's mask."""
    decoder = decoding_model(model, 1, slots, packed=False)
    first = decoder(prompt)[:, -1].argmax(-1, keepdim=True)  # (1, 1)
    return decoder, first, torch.ones_like(prompt, dtype=torch.bool)


def build_package() -> dict:
    """The package of the step (qkv.accel.precompiled, in this process's user cache)."""
    model, _ = model_and_prompt()
    path, seconds = precompile(model)
    return {"build_s": seconds, "package_mb": os.path.getsize(path) / 1e6}


def worker(impl: str) -> dict:
    if impl in ("ct2", "hf"):  # the peers, as bench/generate_gpt.py runs them at batch 1 (two timed generations)
        peer = peer_worker(impl, 1, 2)
        return {"impl": impl, "ready_s": 0.0, "first_token_since_start_s": float("nan"),
                "ms_per_token": peer["ms_per_step"]}
    model, prompt = model_and_prompt()
    if impl in ("completer", "completer-eager"):  # qkv generate's own loop (text in, text out), 200 tokens
        tokenizer = CharTokenizer([chr(c) for c in range(32, 32 + VOCAB - 4)])  # + <pad> <bos> <eos> <unk>
        completer = Completer(model, tokenizer, compile=False if impl == "completer-eager" else None)
        completer.complete("ROMEO:", max_new_tokens=NEW, temperature=0)  # the package loaded, the kernels chosen
        t0 = time.perf_counter()
        completer.complete("ROMEO:", max_new_tokens=NEW, temperature=0)
        return {"impl": impl, "ready_s": 0.0, "first_token_since_start_s": float("nan"),
                "ms_per_token": 1000 * (time.perf_counter() - t0) / NEW, "loaded": completer.policy.choose(NEW).how == "loaded"}
    with torch.no_grad():
        if impl == "eager":
            first_token = []
            generate(model, prompt, 1, temperature=0, on_step=lambda tok: first_token.append(time.perf_counter()))
            t0 = time.perf_counter()
            generate(model, prompt, NEW, temperature=0)  # the kernels' choice made by the first generation
            return {"impl": impl, "ready_s": 0.0, "first_token_since_start_s": first_token[0] - STARTED,
                    "ms_per_token": 1000 * (time.perf_counter() - t0) / NEW}
        t0 = time.perf_counter()
        decoder, first, mask = prepared(model, prompt, cache_slots(model) if impl == "aot" else model.cfg.max_len)
        step = LoadedStep(decoder, mask, package_path(model)) if impl == "aot" else CompiledStep(decoder, mask)
        times, seen, fed = [], [], [first]
        for i in range(NEW):
            t1 = time.perf_counter()
            logits = step(fed[-1], torch.tensor([[PROMPT + i]]), PROMPT + i)[:, -1]  # (1, V)
            times.append(time.perf_counter() - t1)
            if i == 0:
                ready, since_start = time.perf_counter() - t0, time.perf_counter() - STARTED
            seen.append(logits.clone())
            fed.append(logits.argmax(-1, keepdim=True))  # (1, 1)
        # The same tokens through the eager model, its caches anew: every step's logits, within fp32 rounding.
        eager = decoding_model(model, 1, model.cfg.max_len, packed=False)
        eager(prompt)
        worst = max(float((eager(token)[:, -1] - logits).abs().max()) for token, logits in zip(fed, seen))
    return {"impl": impl, "ready_s": ready, "first_token_since_start_s": since_start,
            "ms_per_token": 1000 * statistics.median(times[1:]),
            "worst_logit_difference": worst, "distinct_tokens": len({int(t) for t in fed})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impls", default="eager,jit,aot,ct2,hf")
    ap.add_argument("--out", default="bench/results/aot_step.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    with tempfile.TemporaryDirectory() as tmp:  # the package in a user cache of its own, for every worker
        os.environ[CACHE_ENV] = str(cache_path())  # the kernels chosen before on this machine, kept
        os.environ["XDG_CACHE_HOME"] = tmp
        build = build_package()
        print(f"package: {build}", file=sys.stderr)
        runs = run_alternating(__file__, args.impls.split(","), args.repeats, [])
    keys = ("ready_s", "first_token_since_start_s", "ms_per_token")
    summary = {impl: {key: median_of(rs, key) for key in keys} for impl, rs in runs.items()}
    for ours in ("eager", "jit", "aot"):
        for peer in ("ct2", "hf"):
            if ours in summary and peer in summary:
                summary[f"ratio_{ours}_over_{peer}"] = summary[peer]["ms_per_token"] / summary[ours]["ms_per_token"]
    write_result(args.out, {"benchmark": "a batch-1 GPT step compiled ahead of time and loaded, against compiling "
                                         "it in the process (nanoGPT config, 200 tokens)",
                            "package": build, "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
