"""What compiling beam search's decoder step ahead of time would buy: a measurement before building it.

qkv's beam search (bench/beam_mt.py's shapes: beam 4 over 16 sources of 18-22 tokens, the small
encoder-decoder, vocabulary 8,000) runs its decoder step eagerly. Here the same step, at the search's
shapes (64 hypotheses, cross-attention grouped by sentence), is exported and built by AOTInductor as
qkv.accel.precompiled builds a GPT's step (the self-attention caches and the cross-attention keys
and values as inputs, the key mask's length the one dynamic size, the weights frozen), and timed beside
the eager step over the same 30 steps, and beside the whole searches of qkv and CTranslate2 (per step:
a search's time over its 31 steps). The exported step is for timing only: the decoder embeds the
position its caches' length gives, which the step's slot-written caches keep at the first step's, so its
logits are not the search's. ``--with-choice`` also exports the step together with what the search
does next on the device, the log-softmax and the choice of the 2k best continuations of each sentence
(``_best_continuations``), and times that graph beside the same work eager (``choice-aot`` and
``choice-eager``).

``--size`` is bench/beam_mt.py's (``tiny``: what compiling does to a step's cost besides arithmetic).

    python bench/probes/beam_step_aot.py [--repeats 3] [--with-choice] [--size small|tiny|base] [--out FILE]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch
from torch import Tensor, nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes beside it, and bench/'s common and peers
from beam_mt import BEAM, NEW, SIZES, model_of, searches, sources  # noqa: E402
from common import decoding_bench_args, median_of, run_alternating, time_steps, write_result  # noqa: E402

from qkv.generation.beam import _best_continuations  # noqa: E402
from qkv.accel.compiled import CompiledStep, SlotCache, caches_of  # noqa: E402
from qkv.accel.kernels import decoding_model  # noqa: E402
from qkv.accel.precompiled import PACKAGE_OPTIONS  # noqa: E402
from qkv.modules.attention import StaticKV, padding_mask  # noqa: E402

PACKAGE_ENV = "QKV_BENCH_BEAM_PACKAGE"
SLOTS = NEW + 2  # the caches: the search's 31 steps, and one slot more (qkv.accel.precompiled.cache_slots)


def choice_package(path: str) -> str:
    """Where the package of the step with the choice of continuations goes, beside the step's own."""
    return path.removesuffix(".pt2") + "-choice.pt2"


def model_and_sources(size: str):
    model = model_of(size)
    src = sources(model.cfg.vocab_size)
    return model, src, padding_mask(src, model.cfg.pad_id)  # (B, S), (B, 1, 1, S)


def first_step(model, src: Tensor, src_mask: Tensor, packed: bool) -> nn.Module:
    """The search's decoder after its first step: one row per sentence, its caches then widened to the k
    hypotheses; the weights packed for the eager steps as the search packs them (``packed``), or left for the
    compiled step."""
    b = src.shape[0]
    decoder = decoding_model(model, b * BEAM, SLOTS, packed=packed)
    decoder.reorder_cache(torch.arange(b))
    decoder.decode(torch.ones(b, 1, dtype=torch.long), decoder.encode(src, src_mask), src_mask)
    decoder.reorder_cache(torch.arange(b).repeat_interleave(BEAM))
    return decoder


def step_inputs(model) -> list[Tensor]:
    """The self-attention caches' keys and values, then the cross-attention ones (grouped: one row a sentence)."""
    cross = [layer.cross_attn.cache for layer in model.decoder_layers]
    return [t for c in caches_of(model) for t in (c.k, c.v)] + [t for c in cross for t in (c.k, c.v)]


class _Step(nn.Module):
    """The decoder step with its caches as inputs; the mask's length is the span of self-attention slots read."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, mask: Tensor, slot: Tensor, src_mask: Tensor, *kv: Tensor) -> Tensor:
        n = 2 * len(self.model.decoder_layers)
        # (N K, H, SLOTS, Dh) each; the first step's length: the position every step embeds (timing only)
        own = [SlotCache(k, v, slot, length=1, span=mask.shape[-1]) for k, v in zip(kv[0:n:2], kv[1:n:2])]
        cross = [StaticKV() for _ in own]
        for cache, k, v in zip(cross, kv[n::2], kv[n + 1::2]):
            cache.set(k, v)  # (N, H, S, Dh)
        return self.model.decode(tokens, None, src_mask, tgt_mask=mask, caches=list(zip(own, cross)))  # (N K, 1, V)


class _StepAndChoice(nn.Module):
    """The step, then the search's next operations on the device: the log-probabilities of the next token and
    the 2k best continuations of each sentence, given the hypotheses' scores (N, K)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.step = _Step(model)

    def forward(self, tokens: Tensor, mask: Tensor, slot: Tensor, src_mask: Tensor, scores: Tensor,
                *kv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logp = torch.log_softmax(self.step(tokens, mask, slot, src_mask, *kv)[:, -1].float(), dim=-1)  # (N K, V)
        n, k = scores.shape
        return _best_continuations(logp.view(n, k, -1), scores, 2 * k)  # (N, 2K) each


def choose_eager(logits: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """What the search does with a step's (N K, V) logits, as beam_search does it."""
    logp = torch.log_softmax(logits.float(), dim=-1, out=logits)
    n, k = scores.shape
    return _best_continuations(logp.view(n, k, -1), scores, 2 * k)


@torch.no_grad()
def build(path: str, size: str, with_choice: bool = False) -> float:
    """Export and build the step (and, ``with_choice``, the choice of continuations after it) at the search's
    shapes, on :func:`beam_mt.model_of` ``size``, into ``path``; the seconds it took."""
    from torch._inductor import aoti_compile_and_package

    model, src, src_mask = model_and_sources(size)
    decoder = first_step(model, src, src_mask, packed=False)
    rows = src.shape[0] * BEAM
    t0 = time.perf_counter()
    step = CompiledStep(decoder, torch.ones(rows, 1, dtype=torch.bool))  # its step model only, not compiled here
    mask = step.visible[:, None, None, :SLOTS - 1].contiguous()  # (N K, 1, 1, span)
    kv = step_inputs(step.model)
    span = {3: torch.export.Dim("span", min=2, max=SLOTS - 1)}
    head = (torch.ones(rows, 1, dtype=torch.long), mask, step.slot, src_mask)
    if with_choice:
        exported = torch.export.export(_StepAndChoice(step.model), (*head, torch.zeros(src.shape[0], BEAM), *kv),
                                       strict=False,
                                       dynamic_shapes=(None, span, None, None, None, tuple(None for _ in kv)))
    else:
        exported = torch.export.export(_Step(step.model), (*head, *kv), strict=False,
                                       dynamic_shapes=(None, span, None, None, tuple(None for _ in kv)))
    aoti_compile_and_package(exported, package_path=path, inductor_configs=dict(PACKAGE_OPTIONS))
    return time.perf_counter() - t0


@torch.no_grad()
def worker(impl: str, reps: int, size: str) -> dict:
    if impl in ("qkv", "ct2"):  # whole searches, as bench/beam_mt.py times them
        times = time_steps(searches(impl, size), reps, warmup=1)
        return {"impl": impl, "ms_per_step": 1000 * statistics.median(times) / (NEW + 1)}
    model, src, src_mask = model_and_sources(size)
    rows = src.shape[0] * BEAM
    tokens = torch.full((rows, 1), 5)
    scores = torch.randn(src.shape[0], BEAM, generator=torch.Generator().manual_seed(0))  # (N, K)
    choice = impl.startswith("choice")
    package = choice_package(os.environ[PACKAGE_ENV]) if choice else os.environ[PACKAGE_ENV]
    loader = torch._C._aoti.AOTIModelPackageLoader(package, "model", False, 1, -1)
    eager = impl.endswith("eager")
    per_run = []
    for _ in range(reps + 1):  # the first untimed
        decoder = first_step(model, src, src_mask, packed=eager)
        kv, slot = step_inputs(decoder), torch.zeros(1, dtype=torch.long)
        visible = torch.ones(rows, SLOTS, dtype=torch.bool)
        steps = []
        for i in range(1, NEW + 1):
            t0 = time.perf_counter()
            if eager:
                logits = decoder.decode(tokens, None, src_mask)
                if choice:
                    choose_eager(logits[:, -1], scores)
            else:
                slot.fill_(i)
                mask = visible[:, None, None, :i + 1].contiguous()  # (N K, 1, 1, span)
                loader.run([tokens, mask, slot, src_mask, *([scores] if choice else []), *kv])
            steps.append(time.perf_counter() - t0)
        per_run.append(statistics.fmean(steps))
    return {"impl": impl, "ms_per_step": 1000 * statistics.median(per_run[1:])}


def main() -> None:
    def extra(ap) -> None:
        ap.add_argument("--with-choice", action="store_true",
                        help="also the step with the log-softmax and the choice of continuations, exported together")
        ap.add_argument("--size", choices=SIZES, default="small")
    args = decoding_bench_args(__doc__, "bench/results/beam_step_aot.json", 3,
                               lambda a: worker(a.worker, a.reps, a.size),
                               "timed searches (or runs of 30 steps) per process", extra)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[PACKAGE_ENV] = os.path.join(tmp, "beam_step.pt2")
        build_s = build(os.environ[PACKAGE_ENV], args.size)
        impls = ["qkv", "ct2", "step-eager", "step-aot"]
        if args.with_choice:
            build_s = [build_s, build(choice_package(os.environ[PACKAGE_ENV]), args.size, with_choice=True)]
            impls += ["choice-eager", "choice-aot"]
        runs = run_alternating(__file__, impls, args.repeats, ["--reps", str(args.reps), "--size", args.size])
    summary = {impl: median_of(rs, "ms_per_step") for impl, rs in runs.items()}
    # The search with the exported step in place of the eager one: the rest of the search as measured.
    summary["projected_search_with_aot_step"] = summary["qkv"] - summary["step-eager"] + summary["step-aot"]
    summary["ratio_qkv_over_ct2"] = summary["ct2"] / summary["qkv"]
    summary["ratio_projected_over_ct2"] = summary["ct2"] / summary["projected_search_with_aot_step"]
    summary["ratio_step_aot_over_eager"] = summary["step-eager"] / summary["step-aot"]
    if args.with_choice:  # the same, with the step and the choice after it exported together
        summary["projected_search_with_aot_choice"] = summary["qkv"] - summary["choice-eager"] + summary["choice-aot"]
        summary["ratio_projected_choice_over_ct2"] = summary["ct2"] / summary["projected_search_with_aot_choice"]
    write_result(args.out, {"benchmark": "beam search's decoder step exported and built ahead of time (timing "
                                         "only), beside the eager step and whole searches, ms a step",
                            "size": args.size, "build_s": build_s, "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
