"""Autoregressive generation for GPT: prefill the prompt once, then one cached step per new token, and the one
rule for which step that is (:class:`StepPolicy`).

"At each step the model is auto-regressive, consuming the previously generated symbols as additional
input when generating the next" (Section 3). With the KV cache each step feeds only the newest token.
Prompts of different lengths are left-padded so that every row's last prompt token sits in the same
column; a key padding mask hides the pads and per-row positions start at 0 at each row's first token.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Literal, Sequence

import torch
from torch import Tensor, nn

from qkv.accel.compiled import CompiledStep, check_can_compile, cpu_compiler_available
from qkv.accel.kernels import decoding, step_linears
from qkv.accel.precompiled import LoadedStep, cache_slots, can_precompile, find, precompile
from qkv.config import TEMPERATURE
from qkv.devices import model_device
from qkv.generation.sampling import check_sampling_args, next_token


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[Tensor, Tensor]:
    """(B, T) left-padded ids and the (B, T) bool mask of real tokens."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (start empty prompts with a start token)")
    t = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), t), pad_id, dtype=torch.long, device=device)
    real = torch.zeros((len(prompts), t), dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        ids[i, t - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        real[i, t - len(p):] = True
    return ids, real


@torch.no_grad()
def generate(
    model,
    prompts: Sequence[Sequence[int]] | Tensor,
    max_new_tokens: int,
    temperature: float = TEMPERATURE,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    pad_id: int = 0,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_step: Callable[[Tensor], bool | None] | None = None,
    compile: bool | None = None,
    sliding_window: bool = False,
) -> list[list[int]]:
    """Continue each prompt by up to ``max_new_tokens`` tokens: the one decoding loop of a GPT, which
    :class:`~qkv.generation.completer.Completer` and ``qkv generate`` run too.

    Args:
        model: a ``GPT``.
        prompts: token-id lists (any lengths), or a (B, T) tensor of equal-length prompts.
        temperature: 0 = greedy; otherwise softmax(logits / temperature) sampling (by default 0.8, as
            everywhere: ``qkv.config.TEMPERATURE``).
        top_k, top_p: restrict sampling to the k most likely tokens / the nucleus of mass top_p.
        eos_id: a row stops after producing it (it is included in the output).
        use_cache: False recomputes the whole prefix every step (slow; for testing the cache).
        generator: a seeded ``torch.Generator`` makes sampling reproducible.
        on_step: called with the (B,) new tokens after every step (for streaming); returning True stops the
            generation there (a stop string found).
        compile: how the steps after the prompt run (:class:`StepPolicy`, below). None, the default
            of every caller: a step compiled ahead of time where one was built for this model and batch size,
            torch.compile's for one prompt from ``COMPILE_AFTER`` new tokens, eager otherwise. True: one
            prompt's steps compiled (faster steps on a CPU, after seconds of compiling); False: eager.
        sliding_window: one prompt, which with its continuation may exceed the context: the model sees the
            last ``max_len`` tokens, and once the window is full each step recomputes it (nanoGPT's crop;
            learned positions cannot be shifted inside a cache).

    Returns:
        The new tokens of each row.
    """
    check_sampling_args(temperature, top_k, top_p)
    if compile and not use_cache:
        raise ValueError("a compiled decoding step is the cached one; it needs use_cache=True")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    device = next(model.parameters()).device
    policy = StepPolicy(model, compile)
    if isinstance(prompts, Tensor):
        prompts = prompts.tolist()
    if sliding_window:
        if len(prompts) != 1:
            raise ValueError(f"a sliding window decodes one prompt at a time, got {len(prompts)}")
        prompts = [list(prompts[0])[-model.cfg.max_len:]]  # the window the model sees first
    ids, real = left_pad(prompts, pad_id, device)  # (B, T) each
    b, t = ids.shape
    max_len = model.cfg.max_len
    total = t + max_new_tokens
    if total > max_len and not sliding_window:
        raise ValueError(
            f"prompt of {t} tokens + {max_new_tokens} new tokens = {total} exceeds the model's context "
            f"of {max_len} positions; shorten the prompt or ask for fewer tokens"
        )
    how, package = policy.choose(max_new_tokens, b) if use_cache else ("eager", None)
    was_training = model.training
    model.eval()
    padded = not bool(real.all())
    key_mask = real  # (B, L) grows by one column per step
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): 0 at each row's first real token
    done = torch.zeros(b, dtype=torch.bool, device=device)
    steps: list[Tensor] = []  # the (B,) tokens of each step; turned into lists once, at the end
    step: CompiledStep | None = None  # the compiled step, once the prompt is prefilled
    cached = use_cache  # False: every step recomputes the prefix (use_cache=False, or a full sliding window)
    try:
        # The caches and, for eager steps, the weights laid out for b-row products; compiled steps use no
        # packing. Both go when the block ends, as does the compiled step's transformation of the model.
        # Compiled steps read caches of the model's whole context, as every generation of the process does:
        # the graph is specialised to the caches' length, and one length lets later generations reuse it (a
        # cache of `total` positions compiled anew, seconds, for every other length). A package's step was
        # built for caches of cache_slots.
        cache_len = {"loaded": cache_slots(model), "compiled": max_len}.get(how, min(total, max_len))
        with decoding(model, b, cache_len, packed=how == "eager") if use_cache else contextlib.nullcontext():
            seq, step_in, step_pos = ids, ids, positions  # seq: every token so far, (B, t + i)
            for i in range(max_new_tokens):
                mask = key_mask[:, None, None, :] if padded else None  # (B, 1, 1, L)
                if step is not None:  # step i feeds the token of step i - 1 into cache slot t + i - 1
                    logits = step(step_in, step_pos, t + i - 1)
                elif cached:  # prefill the prompt once, then feed one position per step
                    logits = model(step_in, mask=mask, positions=step_pos if padded else None)
                elif sliding_window:  # the window is full: the last `max_len` tokens, recomputed
                    logits = model(seq[:, -max_len:])
                else:  # recompute the whole prefix (slow; the reference the cache is tested against)
                    later = positions[:, -1:] + torch.arange(1, seq.shape[1] - t + 1, device=device)  # (B, t')
                    all_pos = torch.cat([positions, later], 1)
                    logits = model(seq, mask=mask, positions=all_pos if padded else None)
                tok = next_token(logits[:, -1], temperature, top_k, top_p, generator)  # (B,)
                if eos_id is not None:
                    tok = tok.masked_fill(done, pad_id)  # finished rows only pad
                steps.append(tok)
                if on_step is not None and on_step(tok):
                    break
                if eos_id is not None:
                    done |= tok == eos_id
                    if bool(done.all()):
                        break
                if not use_cache or sliding_window:  # what a recomputing step reads
                    seq = torch.cat([seq, tok[:, None]], dim=1)
                if cached and t + i == max_len:  # a sliding window's cache is full: recompute from here on
                    model.clear_cache()
                    if step is not None:
                        step.close()
                    step, cached = None, False
                if cached:
                    step_in, step_pos = tok[:, None], step_pos[:, -1:] + 1  # (B, 1) each
                    if step is None and how != "eager":
                        step = LoadedStep(model, real, package) if how == "loaded" else CompiledStep(model, real)
                if padded and step is None:  # a compiled step keeps its own mask (CompiledStep.visible)
                    key_mask = torch.cat([key_mask, torch.ones_like(key_mask[:, :1])], dim=1)
    finally:
        if step is not None:
            step.close()
        model.train(was_training)
    rows = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(b)]
    if eos_id is not None:  # each row ends at its first <eos>, which it keeps
        rows = [row[: row.index(eos_id) + 1] if eos_id in row else row for row in rows]
    return rows


# Which step a generation runs after its prompt: eager, compiled by torch.compile, or compiled ahead of time
# and loaded from the user cache (qkv.accel offers the three; this rule picks, for qkv.generate, the
# Completer and qkv generate alike). A compiled step runs a batch-1 token faster than the eager one on a CPU,
# but compiling costs seconds in every new process; a step compiled ahead of time loads in a fraction of a
# second, but only where one was built for exactly these weights, this batch size and this machine (the
# figures: docs/BENCHMARKS.md, "GPT generation"). So, by default:
#
# - a package built for the model and the batch size runs from PRECOMPILED_AFTER new tokens on;
# - otherwise one prompt's steps are compiled from COMPILE_AFTER new tokens on, on a CPU with a C++
#   compiler, for a model whose steps run fp32 linear maps (not an int8 copy);
# - otherwise the steps run eagerly, their weights laid out for this CPU's fastest kernels (qkv.accel.kernels).
#
# compile=True asks for torch.compile's step (one prompt), compile=False for eager steps only.

# From how many new tokens of one prompt a generation compiles its decoding step by default (on a CPU with a
# C++ compiler): where the milliseconds it saves a token repay the seconds of compiling in a new process, warm
# inductor cache or not (docs/BENCHMARKS.md, "Compiled in the process").
COMPILE_AFTER = 2048
# From how many new tokens a generation runs the step compiled ahead of time, where one was built for the
# model, the batch size and this machine: loading it costs once a process what the milliseconds it saves a
# token repay after a few dozen tokens (docs/BENCHMARKS.md, "Compiled ahead of time and loaded").
PRECOMPILED_AFTER = 32

Step = Literal["eager", "compiled", "loaded"]


class StepPolicy:
    """The decoding step of ``model``'s generations: ``compile`` None (the rule above), True or False.

    Raises ``ValueError`` at once where ``compile=True`` cannot be honoured (no C++ compiler for a CPU).
    """

    def __init__(self, model: nn.Module, compile: bool | None = None) -> None:
        self.model, self.compile = model, compile
        if compile:
            check_can_compile(model_device(model))

    def package(self, rows: int = 1) -> Path | None:
        """The package of the model's step for ``rows`` prompts, if one was built on this machine for these
        weights (looked for at every call: one built meanwhile, by a background build, is found)."""
        return find(self.model, rows)

    def precompile(self, rows: int = 1) -> tuple[Path, float]:
        """Compile the model's step for ``rows`` prompts ahead of time, unless it was (qkv.accel.precompiled)."""
        return precompile(self.model, rows)

    def loads(self, max_new_tokens: int, rows: int = 1) -> bool:
        """Whether a generation of ``max_new_tokens`` for ``rows`` prompts runs the step compiled ahead of time."""
        return self._package_to_load(max_new_tokens, rows) is not None

    def would_load(self, max_new_tokens: int, rows: int = 1) -> bool:
        """Whether such a generation would run a step compiled ahead of time if one were built, and none is:
        what ``qkv generate`` builds in the background."""
        return (self.compile is None and max_new_tokens >= PRECOMPILED_AFTER and not self.loads(max_new_tokens, rows)
                and can_precompile(self.model) and cpu_compiler_available())

    def compiles(self, max_new_tokens: int, rows: int = 1) -> bool:
        """Whether a generation of ``max_new_tokens`` for ``rows`` prompts runs torch.compile's step: one prompt
        only (larger batches decode eagerly, where the weight products dominate)."""
        return self._would_compile(max_new_tokens, rows) and not self.loads(max_new_tokens, rows)

    def choose(self, max_new_tokens: int, rows: int = 1) -> tuple[Step, Path | None]:
        """The step a generation runs, and the package it loads (None unless ``"loaded"``); the package is looked
        for once."""
        package = self._package_to_load(max_new_tokens, rows)
        if package is not None:
            return "loaded", package
        return ("compiled", None) if self._would_compile(max_new_tokens, rows) else ("eager", None)

    def _package_to_load(self, max_new_tokens: int, rows: int) -> Path | None:
        """The package such a generation loads: by default, from PRECOMPILED_AFTER new tokens, where one was built."""
        return self.package(rows) if self.compile is None and max_new_tokens >= PRECOMPILED_AFTER else None

    def _would_compile(self, max_new_tokens: int, rows: int) -> bool:
        """Whether such a generation runs torch.compile's step, unless a package runs instead."""
        if rows != 1 or self.compile is False:
            return False
        if self.compile:
            return True
        return (max_new_tokens >= COMPILE_AFTER and model_device(self.model).type == "cpu"
                and bool(step_linears(self.model)) and cpu_compiler_available())
