"""One decoding step of a GPT compiled whole by ``torch.compile``: fast batch-1 generation on a CPU.

At batch 1 a step multiplies one vector by every weight and runs some 200 small operations around
those products (LayerNorms, GELU, residual adds, splitting heads, attention over the cache). Eager
PyTorch dispatches each of them from Python, which costs about as much as the products. Compiled
(inductor), a layer is a few fused C++ loops, attention included, the products read the weights
near memory speed (``qkv.modules.linear.compiled_linear``), and the step is one call.

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

import torch
from torch import Tensor

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


class CompiledStep:
    """Feed one token per row through ``model`` (a GPT whose prompt is prefilled) in a compiled graph.

    Args:
        model: the GPT, with caches set up (``setup_cache``) and the prompt prefilled into them.
        prompt: (B, T) bool, True where the prefilled slots 0 .. T-1 hold a real token (False for the
            left padding of shorter prompts).
    """

    def __init__(self, model: torch.nn.Module, prompt: Tensor) -> None:
        check_can_compile(prompt.device)
        caches = [m.cache for m in model.modules() if isinstance(getattr(m, "cache", None), KVCache)]
        if not caches:
            raise ValueError("CompiledStep needs a model with caches set up (model.setup_cache)")
        b, t = prompt.shape
        self.visible = torch.zeros(b, caches[0].max_len, dtype=torch.bool, device=prompt.device)  # (B, L)
        self.visible[:, :t] = prompt
        self.slot = torch.zeros(1, dtype=torch.long, device=prompt.device)
        for cache in caches:
            cache.slot = self.slot
        self.forward = torch.compile(model, fullgraph=True, dynamic=False, options=INDUCTOR_OPTIONS)

    def __call__(self, tokens: Tensor, positions: Tensor, slot: int) -> Tensor:
        """tokens, positions: (B, 1); slot: the cache slot the tokens go to. Returns (B, 1, V) logits."""
        self.slot.fill_(slot)
        self.visible[:, slot] = True
        return self.forward(tokens, mask=self.visible[:, None, None, :], positions=positions)  # mask (B, 1, 1, L)
