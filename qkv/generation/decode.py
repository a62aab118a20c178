"""Autoregressive generation for GPT: prefill the prompt once, then one cached step per new token, the step
chosen once a generation (:class:`~qkv.generation.policy.StepPolicy`).

"At each step the model is auto-regressive, consuming the previously generated symbols as additional
input when generating the next" (Section 3). With the KV cache each step feeds only the newest token.
Prompts of different lengths are left-padded so that every row's last prompt token sits in the same
column; a key padding mask hides the pads and per-row positions start at 0 at each row's first token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from qkv.accel.compiled import CompiledStep
from qkv.accel.kernels import decoding_model
from qkv.accel.precompiled import LoadedStep, cache_slots
from qkv.config import TEMPERATURE
from qkv.generation.policy import Step, StepPolicy, looked_at
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
    step: Step | None = None,
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
        compile: how the steps after the prompt run (:class:`~qkv.generation.policy.StepPolicy`). None, the default
            of every caller: a step compiled ahead of time where one was built for this model and batch size,
            torch.compile's for one prompt from ``COMPILE_AFTER`` new tokens, eager otherwise. True: one
            prompt's steps compiled (faster steps on a CPU, after seconds of compiling); False: eager. A model
            with a hook on a module (``heads_off``) or inside ``capture_attention`` decodes eagerly.
        sliding_window: one prompt, which with its continuation may exceed the context: the model sees the
            last ``max_len`` tokens, and once the window is full each step recomputes it (nanoGPT's crop;
            learned positions cannot be shifted inside a cache).
        step: the step already chosen for these prompts (``StepPolicy.choose``, as the Completer does), in place
            of ``compile``'s choice; its ``rows`` must be the number of prompts.

    Returns:
        The new tokens of each row.
    """
    check_sampling_args(temperature, top_k, top_p)
    if compile and not use_cache:
        raise ValueError("a compiled decoding step is the cached one; it needs use_cache=True")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    device = next(model.parameters()).device
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
    if step is None:
        step = StepPolicy(model, compile).choose(max_new_tokens, b) if use_cache else Step("eager", b)
    elif step.rows != b or (step.how != "eager" and not use_cache):
        raise ValueError(f"the {step.how} step was chosen for {step.rows} prompt(s) with a cache, and this "
                         f"generation has {b}{'' if use_cache else ' without a cache'}: choose the step for it")
    elif step.how != "eager" and looked_at(model):
        raise ValueError(f"the {step.how} step runs no hooks and reports no attention, and this model has a hook or "
                         "its attention is captured: choose the step with them in place (StepPolicy.choose)")
    how = step.how
    padded = not bool(real.all())
    key_mask = real  # (B, L) grows by one column per step
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): 0 at each row's first real token
    done = torch.zeros(b, dtype=torch.bool, device=device)
    steps: list[Tensor] = []  # the (B,) tokens of each step; turned into lists once, at the end
    running: CompiledStep | LoadedStep | None = None  # the compiled or loaded step, once the prompt is prefilled
    cached = use_cache  # False: every step recomputes the prefix (use_cache=False, or a full sliding window)
    # The decoding model: a copy of the model's modules in eval mode, sharing its weights (qkv.accel.swap), with
    # the caches and, for eager steps, the weights laid out for b-row products; compiled steps use no packing
    # and run a copy of their own (CompiledStep.model). The model itself is not changed.
    # Compiled steps read caches of the model's whole context, as every generation of the process does: the
    # graph is specialised to the caches' length, and one length lets later generations reuse it (a cache of
    # `total` positions compiled anew, seconds, for every other length). A package's step was built for caches
    # of cache_slots.
    cache_len = {"loaded": cache_slots(model), "compiled": max_len}.get(how, min(total, max_len))
    decoder = decoding_model(model, b if use_cache else None, cache_len, packed=how == "eager")
    seq, step_in, step_pos = ids, ids, positions  # seq: every token so far, (B, t + i)
    for i in range(max_new_tokens):
        mask = key_mask[:, None, None, :] if padded else None  # (B, 1, 1, L)
        if running is not None:  # step i feeds the token of step i - 1 into cache slot t + i - 1
            logits = running(step_in, step_pos, t + i - 1)
        elif cached:  # prefill the prompt once, then feed one position per step
            logits = decoder(step_in, mask=mask, positions=step_pos if padded else None)
        elif sliding_window:  # the window is full: the last `max_len` tokens, recomputed
            logits = decoder(seq[:, -max_len:])
        else:  # recompute the whole prefix (slow; the reference the cache is tested against)
            later = positions[:, -1:] + torch.arange(1, seq.shape[1] - t + 1, device=device)  # (B, t')
            all_pos = torch.cat([positions, later], 1)
            logits = decoder(seq, mask=mask, positions=all_pos if padded else None)
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
            decoder.clear_cache()
            running, cached = None, False
        if cached:
            step_in, step_pos = tok[:, None], step_pos[:, -1:] + 1  # (B, 1) each
            if running is None and how != "eager":
                running = LoadedStep(decoder, real, step.package) if how == "loaded" else CompiledStep(decoder, real)
        if padded and running is None:  # a compiled step keeps its own mask (CompiledStep.visible)
            key_mask = torch.cat([key_mask, torch.ones_like(key_mask[:, :1])], dim=1)
    rows = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(b)]
    if eos_id is not None:  # each row ends at its first <eos>, which it keeps
        rows = [row[: row.index(eos_id) + 1] if eos_id in row else row for row in rows]
    return rows

