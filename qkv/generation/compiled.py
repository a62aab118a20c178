"""One decoding step of a GPT compiled whole by ``torch.compile``: fast batch-1 generation on a CPU.

At batch 1 a step multiplies one vector by every weight and runs some 200 small operations around
those products (LayerNorms, GELU, residual adds, splitting heads, attention over the cache). Eager
PyTorch dispatches each of them from Python, which costs about as much as the products. Compiled
(inductor), a layer is a few fused C++ loops, attention included, the products read the weights
near memory speed (``qkv.generation.kernels.compiled_linear``), and the step is one call.

The model is transformed from outside for the time of the generation: every linear map of a step
computes :func:`~qkv.generation.kernels.compiled_linear`, every attention module the explicit
formula (inductor fuses it into the layer's loops, where SDPA's CPU kernel is a call of its own,
~0.2 ms of a 2 ms GPT step) and observes nothing (a compiled graph cannot read the ContextVar that
``capture_attention`` sets). :meth:`CompiledStep.close` puts the model back.

One graph must serve every step, so a step has fixed shapes: each KV cache writes the new position
at the slot a (1,) tensor names (``KVCache.slot``) and attention reads all of the cache's slots
through a key mask that hides the ones not yet written. Positions come as a tensor too. The prompt
is still prefilled by the eager model, whose cache path writes slots 0 .. T-1.

The first call compiles: ~17 s at the nanoGPT config, ~5 s once inductor's disk cache holds the
kernels (docs/BENCHMARKS.md). Logits equal the eager model's up to fp32 rounding: the products sum
in another order.
"""

from __future__ import annotations

import shutil
from typing import Any

import torch
from torch import Tensor, nn

from qkv.generation.kernels import compiled_linear, step_linears
from qkv.modules.attention import Attention, SelfAttention, scaled_dot_product_attention
from qkv.modules.kv_cache import KVCache

# Inductor by default recomputes a LayerNorm or GELU inside the loop over each row of the weight that
# consumes it (the erf of GELU 384 times over). Storing such results once made a step 2.7 ms instead
# of 3.5 at the nanoGPT config.
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


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
                       dropout_p: float = 0.0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """:func:`~qkv.modules.attention.scaled_dot_product_attention` on its explicit path, always."""
    out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal, dropout_p, need_weights=True)
    return out, (weights if need_weights else None)


def _observes_nothing() -> None:
    return None


def caches_of(model: nn.Module) -> list[KVCache]:
    """The KV caches set up in ``model``'s self-attention layers, in the model's order (the order in which a
    step compiled ahead of time takes their tensors, qkv.generation.precompiled)."""
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
        self._swapped: list[tuple[nn.Module, str, Any]] = []
        for m in step_linears(model):
            self._swap(m, "__class__", _CompiledLinear)
        for m in model.modules():
            if isinstance(m, Attention):
                self._swap(m, "kernel", explicit_attention)
                self._swap(m, "observer", _observes_nothing)
        b, t = prompt.shape
        self.visible = torch.zeros(b, caches[0].max_len, dtype=torch.bool, device=prompt.device)  # (B, L)
        self.visible[:, :t] = prompt
        self.slot = torch.zeros(1, dtype=torch.long, device=prompt.device)
        for cache in caches:
            cache.slot = self.slot
        try:
            self.forward = self.compile(model)
        except BaseException:
            self.close()  # the model as it was, whatever stopped the compiling or loading
            raise

    def compile(self, model: nn.Module) -> Any:
        """``model`` compiled for the step, as ``forward(tokens, mask=..., positions=...)``: by torch.compile
        here, lazily (the first call compiles); :class:`~qkv.generation.precompiled.LoadedStep` loads one
        compiled ahead of time instead."""
        return torch.compile(model, fullgraph=True, dynamic=False, options=INDUCTOR_OPTIONS)

    def _swap(self, module: nn.Module, name: str, value: Any) -> None:
        old = type(module) if name == "__class__" else module.__dict__.get(name)
        self._swapped.append((module, name, old))
        setattr(module, name, value)

    def close(self) -> None:
        """Put the model back as it was: its own linear maps and attention."""
        for module, name, old in reversed(self._swapped):
            if old is None:
                delattr(module, name)
            else:
                setattr(module, name, old)
        self._swapped = []

    def __call__(self, tokens: Tensor, positions: Tensor, slot: int) -> Tensor:
        """tokens, positions: (B, 1); slot: the cache slot the tokens go to. Returns (B, 1, V) logits."""
        self.slot.fill_(slot)
        self.visible[:, slot] = True
        return self.forward(tokens, mask=self.visible[:, None, None, :], positions=positions)  # mask (B, 1, 1, L)
