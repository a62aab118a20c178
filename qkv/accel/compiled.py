"""One decoding step of a GPT compiled whole by ``torch.compile``: fast batch-1 generation on a CPU.

At batch 1 a step multiplies one vector by every weight and runs some 200 small operations around
those products (LayerNorms, GELU, residual adds, splitting heads, attention over the cache). Eager
PyTorch dispatches each of them from Python, which costs about as much as the products. Compiled
(inductor), a layer is a few fused C++ loops, attention included, the products read the weights
near memory speed (``qkv.accel.kernels.compiled_linear``), and the step is one call.

The step runs a decoding copy of the model (qkv.accel.swap) with modules of its own swapped in: every
linear map of a step computes :func:`~qkv.accel.kernels.compiled_linear`, every self-attention the
explicit formula (inductor fuses it into the layer's loops, where SDPA's CPU kernel is a call of its
own, a tenth of a compiled GPT step) and observes nothing (a compiled graph cannot read the ContextVar
that ``capture_attention`` sets). The model it is made from is not changed.

One graph must serve every step, so a step has fixed shapes: each KV cache writes the new position
at the slot a (1,) tensor names (a :class:`SlotCache` over the buffers of the cache it is made from)
and attention reads all of its slots through a key mask that hides the ones not yet written.
Positions come as a tensor too. The prompt is prefilled by the eager decoding model, whose cache path
writes slots 0 .. T-1, into the buffers the step then reads.

The first call compiles, for seconds, fewer once inductor's disk cache holds the kernels
(docs/BENCHMARKS.md, "Compiled in the process"). Logits equal the eager model's up to fp32 rounding: the products sum
in another order.
"""

from __future__ import annotations

import shutil
from typing import Any

import torch
from torch import Tensor, nn

from qkv.accel.kernels import compiled_linear, step_linears
from qkv.accel.swap import decoding_copy, rebuilt, swap_modules
from qkv.modules.attention import KVCache, SelfAttention, scaled_dot_product_attention

# Inductor by default recomputes a LayerNorm or GELU inside the loop over each row of the weight that
# consumes it (the erf of GELU 384 times over). Storing such results once makes a step faster
# (docs/BENCHMARKS.md, "The figures behind the decoding rules").
INDUCTOR_OPTIONS = {"realize_opcount_threshold": 0, "realize_cpu_opcount_threshold": 0, "realize_reads_threshold": 1}


def cpu_compiler_available() -> bool:
    """Whether inductor's CPU backend has a C++ compiler (it writes and builds C++ for CPU graphs)."""
    from torch._inductor import cpp_builder

    try:
        return shutil.which(cpp_builder.get_cpp_compiler()) is not None
    except (RuntimeError, OSError):
        return False


def check_can_compile(device: torch.device) -> None:
    """A clear error, before any work, where a decoding step cannot be compiled."""
    if device.type == "cpu" and not cpu_compiler_available():
        raise ValueError("compiling the decoding step on a CPU needs a C++ compiler (g++ or clang++), and none "
                         "was found; install one, or generate without compiling")


class SlotCache(KVCache):
    """A :class:`~qkv.modules.attention.KVCache` for steps of fixed shapes: the one new position of a step is
    written at the slot a (1,) tensor names, and attention reads every slot, (B, H, max_len, d_k | d_v), or
    the first ``span`` of them, (B, H, span, d_k | d_v). Shapes that never change, so one compiled graph serves
    every step; the step's mask hides the slots not yet written, and ``length`` stays the prompt's.

    It writes into the buffers of the cache it is made from (:meth:`over`), which the prompt was prefilled
    into, or (``k``, ``v``) into tensors a step compiled ahead of time is given (qkv.accel.precompiled).
    """

    def __init__(self, k: Tensor, v: Tensor, slot: Tensor, length: int = 0, span: int | None = None) -> None:
        self._k, self._v = self.k, self.v = k, v  # (B, H, max_len, d_k | d_v) each
        self.max_len, self.length, self.slot = k.shape[2], length, slot
        # How many slots attention reads (None: all): set by a step compiled ahead of time
        # (qkv.accel.precompiled), a size its graph takes from the mask, so that one graph serves every
        # length and reads no more of the cache than it holds.
        self.span = span

    @classmethod
    def over(cls, cache: KVCache, slot: Tensor) -> SlotCache:
        """The slots of ``cache``'s buffers (the rows in use), from its prefilled length on."""
        return cls(cache.k, cache.v, slot, cache.length)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: (B, H, 1, d_k | d_v), written at ``slot``; returns the (B, H, span or max_len, d_k | d_v) keys and
        values."""
        self.k.index_copy_(2, self.slot, k)
        self.v.index_copy_(2, self.slot, v)
        return self.k[:, :, :self.span], self.v[:, :, :self.span]


class _StepAttention(SelfAttention):
    """Self-attention inside a compiled step (:meth:`of` a ``SelfAttention``, whose W^Q, W^K, W^V, W^O and
    rotation it takes; one class, so that every generation's step finds the graph inductor compiled for the
    first): the explicit formula, which inductor fuses into the layer's loops, no observer (a compiled graph
    cannot read the ContextVar that ``capture_attention`` sets), and a :class:`SlotCache`."""

    @classmethod
    def of(cls, attention: SelfAttention, cache: SlotCache | None) -> _StepAttention:
        new = rebuilt(attention, cls)  # its projections, rotation and configuration
        new.cache = cache
        return new

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, need_weights: bool,
               groups: int = 1) -> tuple[Tensor, Tensor | None]:
        out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal, need_weights=True)  # (B, H, T, d_v)
        return out, (weights if need_weights else None)


def caches_of(model: nn.Module) -> list[KVCache]:
    """The KV caches set up in ``model``'s self-attention layers, in the model's order (the order in which a
    step compiled ahead of time takes their tensors, qkv.accel.precompiled)."""
    return [m.cache for m in model.modules() if isinstance(m, SelfAttention) and m.cache is not None]


class _CompiledLinear(nn.Linear):
    """A linear map inside a compiled step (:func:`~qkv.accel.swap.rebuilt` from an ``nn.Linear``: its weight and bias): one
    class, so that every generation's step finds the graph inductor compiled for the first."""

    def forward(self, x: Tensor) -> Tensor:
        return compiled_linear(x, self.weight, self.bias)


def step_model(model: nn.Module, slot: Tensor) -> nn.Module:
    """The model a compiled step runs: a decoding copy of ``model`` (whose caches hold the prefilled prompt)
    with :class:`_CompiledLinear` maps, :class:`_StepAttention` and a :class:`SlotCache` over each cache's
    buffers, writing at ``slot``."""
    twin = decoding_copy(model)
    steps = {id(m) for m in step_linears(twin)}

    def swap(m: nn.Module) -> nn.Module | None:
        if id(m) in steps:
            return rebuilt(m, _CompiledLinear)
        if type(m) is SelfAttention:
            return _StepAttention.of(m, None if m.cache is None else SlotCache.over(m.cache, slot))
        return None

    return swap_modules(twin, swap)


class CompiledStep:
    """Feed one token per row through ``model`` (a GPT whose prompt is prefilled: its decoding copy from
    ``qkv.accel.kernels.decoding_model``, unpacked) in a compiled graph, on :func:`step_model`.

    Args:
        model: the GPT, with caches set up (``setup_cache``) and the prompt prefilled into them; it is not
            changed, but for the slots its caches' buffers are written.
        prompt: (B, T) bool, True where the prefilled slots 0 .. T-1 hold a real token (False for the
            left padding of shorter prompts).
    """

    needs_compiler = True  # torch.compile's inductor builds C++ (a step compiled before and loaded does not)

    def __init__(self, model: torch.nn.Module, prompt: Tensor) -> None:
        if self.needs_compiler:
            check_can_compile(prompt.device)
        caches = caches_of(model)
        if not caches:
            raise ValueError("CompiledStep needs a model with caches set up (model.setup_cache)")
        b, t = prompt.shape
        self.visible = torch.zeros(b, caches[0].max_len, dtype=torch.bool, device=prompt.device)  # (B, L)
        self.visible[:, :t] = prompt
        self.slot = torch.zeros(1, dtype=torch.long, device=prompt.device)
        self.run = self.compile(model)

    def compile(self, model: nn.Module) -> Any:
        """The step over ``model``'s caches, as ``run(tokens, mask=..., positions=...)``: here its step model
        (:func:`step_model`, kept as ``self.model``) compiled by torch.compile, lazily (the first call
        compiles); :class:`~qkv.accel.precompiled.LoadedStep` loads one compiled ahead of time instead, and
        makes no step model."""
        self.model = step_model(model, self.slot)
        return torch.compile(self.model, fullgraph=True, dynamic=False, options=INDUCTOR_OPTIONS)

    def __call__(self, tokens: Tensor, positions: Tensor, slot: int) -> Tensor:
        """tokens, positions: (B, 1); slot: the cache slot the tokens go to. Returns (B, 1, V) logits."""
        self.slot.fill_(slot)
        self.visible[:, slot] = True
        return self.run(tokens, mask=self.visible[:, None, None, :], positions=positions)  # mask (B, 1, 1, L)
