"""Autoregressive generation for GPT: prefill the prompt once, then one cached step per new token, the step
chosen once a generation (:class:`~qkv.generation.policy.StepPolicy`) and how the model is fed chosen once
before the loop (cached, recomputed, or a sliding window over the context).

"At each step the model is auto-regressive, consuming the previously generated symbols as additional
input when generating the next" (Section 3). With the KV cache each step feeds only the newest token.
Prompts of different lengths are left-padded so that every row's last prompt token sits in the same
column; a key padding mask hides the pads and per-row positions start at 0 at each row's first token.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

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
            torch.compile's for one prompt from ``COMPILE_AFTER`` new tokens, eager otherwise, and after an eager
            generation that a package would have run, one built in the background for the next (as ``qkv
            generate`` does; a :class:`~qkv.generation.policy.PrecompileNotice` says so). True: one
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
    policy = None  # the policy that chose the step here, if it was chosen here
    if step is None:
        policy = StepPolicy(model, compile)
        step = policy.choose(max_new_tokens, b) if use_cache else Step("eager", b)
    elif step.rows != b or (step.how != "eager" and not use_cache):
        raise ValueError(f"the {step.how} step was chosen for {step.rows} prompt(s) with a cache, and this "
                         f"generation has {b}{'' if use_cache else ' without a cache'}: choose the step for it")
    elif step.how != "eager" and looked_at(model):
        raise ValueError(f"the {step.how} step runs no hooks and reports no attention, and this model has a hook or "
                         "its attention is captured: choose the step with them in place (StepPolicy.choose)")
    how = step.how
    # The decoding model: a copy of the model's modules in eval mode, sharing its weights (qkv.accel.swap), with
    # the caches and, for eager steps, the weights laid out for b-row products; compiled steps use no packing
    # and torch.compile's runs a copy of its own (CompiledStep.model). The model itself is not changed.
    # Compiled steps read caches of the model's whole context, as every generation of the process does: the
    # graph is specialised to the caches' length, and one length lets later generations reuse it (a cache of
    # `total` positions compiled anew, seconds, for every other length). A package's step was built for caches
    # of cache_slots.
    cache_len = {"loaded": cache_slots(model), "compiled": max_len}.get(how, min(total, max_len))
    decoder = decoding_model(model, b if use_cache else None, cache_len, packed=how == "eager")
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): 0 at each row's first real token
    feed: _Feed = _Cached(decoder, step, ids, real, positions) if use_cache else _Recompute(decoder, ids, real, positions)
    if sliding_window:
        feed = _SlidingWindow(decoder, feed if use_cache else None, ids)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    steps: list[Tensor] = []  # the (B,) tokens of each step; turned into lists once, at the end
    for i in range(max_new_tokens):
        logits = feed.prefill() if i == 0 else feed(tok)  # (B, T or 1 or L, V)
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
    rows = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(b)]
    if eos_id is not None:  # each row ends at its first <eos>, which it keeps
        rows = [row[: row.index(eos_id) + 1] if eos_id in row else row for row in rows]
    if policy is not None:  # eager where a package would have run: build it for the next generation
        policy.notify(step)
    return rows


class _Feed(Protocol):
    """How a generation feeds its decoding model: the prompt first, then each new token (B,); each returns the
    (B, T', V) logits whose last position predicts the next token. Chosen once, before the loop."""

    def prefill(self) -> Tensor: ...

    def __call__(self, tok: Tensor) -> Tensor: ...


class _Cached:
    """The prompt prefilled into the decoder's caches, then one position a step: eagerly on the decoder, or
    (``step.how`` compiled or loaded) by the compiled step made once the prompt is in the caches.

    Left padding: the key mask (B, L) grows by one real column a step and each row's positions count from its
    first real token; a compiled step keeps a mask of its own (CompiledStep.visible)."""

    def __init__(self, decoder: nn.Module, step: Step, ids: Tensor, real: Tensor, positions: Tensor) -> None:
        self.decoder, self.step, self.ids, self.real, self.positions = decoder, step, ids, real, positions
        self.padded = not bool(real.all())
        self.key_mask = real  # (B, L)
        self.fed = 0  # new tokens fed so far: the next goes to cache slot T + fed
        self.running: CompiledStep | LoadedStep | None = None

    def prefill(self) -> Tensor:
        padded = self.padded
        logits = self.decoder(self.ids, mask=self.real[:, None, None, :] if padded else None,
                              positions=self.positions if padded else None)  # (B, T, V)
        if self.step.how == "loaded":
            self.running = LoadedStep(self.decoder, self.real, self.step.package)
        elif self.step.how == "compiled":
            self.running = CompiledStep(self.decoder, self.real)
        return logits

    def __call__(self, tok: Tensor) -> Tensor:
        position = self.positions[:, -1:] + 1 + self.fed  # (B, 1)
        slot, self.fed = self.ids.shape[1] + self.fed, self.fed + 1
        if self.running is not None:
            return self.running(tok[:, None], position, slot)  # (B, 1, V)
        if not self.padded:
            return self.decoder(tok[:, None])  # (B, 1, V)
        self.key_mask = torch.cat([self.key_mask, torch.ones_like(self.key_mask[:, :1])], dim=1)  # (B, T + fed)
        return self.decoder(tok[:, None], mask=self.key_mask[:, None, None, :], positions=position)


class _Recompute:
    """Every step recomputes the whole prefix, prompt and new tokens (``use_cache=False``: slow; the reference
    the cache is tested against)."""

    def __init__(self, decoder: nn.Module, ids: Tensor, real: Tensor, positions: Tensor) -> None:
        self.decoder, self.seq, self.real, self.positions = decoder, ids, real, positions  # seq: (B, T + fed)
        self.padded = not bool(real.all())

    def prefill(self) -> Tensor:
        return self._over_seq()

    def __call__(self, tok: Tensor) -> Tensor:
        self.seq = torch.cat([self.seq, tok[:, None]], dim=1)
        return self._over_seq()

    def _over_seq(self) -> Tensor:
        if not self.padded:
            return self.decoder(self.seq)  # (B, T + fed, V)
        t, fed = self.real.shape[1], self.seq.shape[1] - self.real.shape[1]
        mask = torch.cat([self.real, self.real.new_ones(self.real.shape[0], fed)], dim=1)  # (B, T + fed)
        later = self.positions[:, -1:] + torch.arange(1, fed + 1, device=self.seq.device)  # (B, fed)
        return self.decoder(self.seq, mask=mask[:, None, None, :], positions=torch.cat([self.positions, later], 1))


class _SlidingWindow:
    """One prompt whose continuation may outgrow the context: cached steps (``cached``) until the caches hold
    ``max_len`` positions, then each step recomputes the last ``max_len`` tokens (nanoGPT's crop: learned
    positions cannot be shifted inside a cache); without a cache (None), every step recomputes them."""

    def __init__(self, decoder: nn.Module, cached: _Cached | None, ids: Tensor) -> None:
        self.decoder, self.cached, self.seq = decoder, cached, ids  # seq: (1, T + fed)
        self.max_len = decoder.cfg.max_len

    def prefill(self) -> Tensor:
        return self.cached.prefill() if self.cached is not None else self.decoder(self.seq[:, -self.max_len:])

    def __call__(self, tok: Tensor) -> Tensor:
        self.seq = torch.cat([self.seq, tok[:, None]], dim=1)
        if self.cached is not None and self.cached.ids.shape[1] + self.cached.fed == self.max_len:
            self.decoder.clear_cache()  # the caches are full: recompute from here on
            self.cached = None
        if self.cached is not None:
            return self.cached(tok)
        return self.decoder(self.seq[:, -self.max_len:])  # (1, max_len, V)
