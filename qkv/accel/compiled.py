"""One decoding step of a GPT compiled whole by ``torch.compile``: fast batch-1 generation on a CPU.

At batch 1 a step multiplies one vector by every weight and runs some 200 small operations around
those products (LayerNorms, GELU, residual adds, splitting heads, attention over the cache). Eager
PyTorch dispatches each of them from Python, which costs about as much as the products. Compiled
(inductor), a layer is a few fused C++ loops, attention included, the products read the weights
near memory speed (``qkv.accel.kernels.compiled_linear``), and the step is one call.

The model is transformed from outside for the time of the generation: every linear map of a step
computes :func:`~qkv.accel.kernels.compiled_linear`, every self-attention the explicit
formula (inductor fuses it into the layer's loops, where SDPA's CPU kernel is a call of its own, a
tenth of a compiled GPT step) and observes nothing (a compiled graph cannot read the ContextVar that
``capture_attention`` sets). :meth:`CompiledStep.close` puts the model back.

One graph must serve every step, so a step has fixed shapes: each KV cache writes the new position
at the slot a (1,) tensor names (a :class:`SlotCache` in each cache's place) and attention reads all of its slots
through a key mask that hides the ones not yet written. Positions come as a tensor too. The prompt
is still prefilled by the eager model, whose cache path writes slots 0 .. T-1.

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
from qkv.modules.attention import KVCache, SelfAttention, scaled_dot_product_attention

# Inductor by default recomputes a LayerNorm or GELU inside the loop over each row of the weight that
# consumes it (the erf of GELU 384 times over). Storing such results once made a step a fifth faster at
# the nanoGPT config (docs/BENCHMARKS.md, "The figures behind the decoding rules").
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

    It holds the buffers of the cache it stands in for (the prompt was prefilled into them) and is put in
    that cache's place by :class:`CompiledStep`, which puts the cache back when it closes.
    """

    def __init__(self, cache: KVCache, slot: Tensor) -> None:
        self.__dict__.update(cache.__dict__)  # the same buffers, rows in use and length
        self.slot = slot
        # How many slots attention reads (None: all): set by a step compiled ahead of time
        # (qkv.accel.precompiled), a size its graph takes from the mask, so that one graph serves every
        # length and reads no more of the cache than it holds.
        self.span: int | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v: (B, H, 1, d_k | d_v), written at ``slot``; returns the (B, H, span or max_len, d_k | d_v) keys and
        values."""
        self.k.index_copy_(2, self.slot, k)
        self.v.index_copy_(2, self.slot, v)
        return self.k[:, :, :self.span], self.v[:, :, :self.span]


class _StepAttention(SelfAttention):
    """Self-attention inside a compiled step (the modules take this class for the time of the generation, one
    class, so that every generation's step finds the graph inductor compiled for the first): the explicit
    formula, which inductor fuses into the layer's loops, and no observer (a compiled graph cannot read the
    ContextVar that ``capture_attention`` sets)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, need_weights: bool,
               groups: int = 1) -> tuple[Tensor, Tensor | None]:
        out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal, need_weights=True)  # (B, H, T, d_v)
        return out, (weights if need_weights else None)


def caches_of(model: nn.Module) -> list[KVCache]:
    """The KV caches set up in ``model``'s self-attention layers, in the model's order (the order in which a
    step compiled ahead of time takes their tensors, qkv.accel.precompiled)."""
    return [m.cache for m in model.modules() if isinstance(m, SelfAttention) and m.cache is not None]


class _CompiledLinear(nn.Linear):
    """A linear map inside a compiled step. Its modules take this class for the time of the generation: one
    class, so that every generation's step finds the graph inductor compiled for the first."""

    def forward(self, x: Tensor) -> Tensor:
        return compiled_linear(x, self.weight, self.bias)


class CompiledStep:
    """Feed one token per row through ``model`` (a GPT whose prompt is prefilled) in a compiled graph.

    Args:
        model: the GPT, with caches set up (``setup_cache``) and the prompt prefilled into them.
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
        # What the step changes in the model, undone in reverse: (module, attribute, before, during).
        self._swapped: list[tuple[Any, str, Any, Any]] = []
        for m in step_linears(model):
            self._swap(m, "__class__", _CompiledLinear)
        for m in model.modules():
            if type(m) is SelfAttention:
                self._swap(m, "__class__", _StepAttention)
                if m.cache is not None:
                    self._swap(m, "cache", SlotCache(m.cache, self.slot))
        try:
            self.forward = self.compile(model)
        except BaseException:
            self.close()  # the model as it was, whatever stopped the compiling or loading
            raise

    def compile(self, model: nn.Module) -> Any:
        """``model`` compiled for the step, as ``forward(tokens, mask=..., positions=...)``: by torch.compile
        here, lazily (the first call compiles); :class:`~qkv.accel.precompiled.LoadedStep` loads one
        compiled ahead of time instead."""
        return torch.compile(model, fullgraph=True, dynamic=False, options=INDUCTOR_OPTIONS)

    def _swap(self, module: nn.Module, name: str, value: Any) -> None:
        self._swapped.append((module, name, getattr(module, name), value))
        setattr(module, name, value)

    def close(self) -> None:
        """Put the model back as it was: its own linear maps, attention and caches (a cache the model has
        removed or replaced since, as a sliding window's recomputing does, stays as the model left it)."""
        for module, name, old, new in reversed(self._swapped):
            if getattr(module, name) is new:
                setattr(module, name, old)
        self._swapped = []

    def __call__(self, tokens: Tensor, positions: Tensor, slot: int) -> Tensor:
        """tokens, positions: (B, 1); slot: the cache slot the tokens go to. Returns (B, 1, V) logits."""
        self.slot.fill_(slot)
        self.visible[:, slot] = True
        return self.forward(tokens, mask=self.visible[:, None, None, :], positions=positions)  # mask (B, 1, 1, L)
