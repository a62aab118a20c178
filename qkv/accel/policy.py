"""Which step a GPT's generation runs after its prompt: eager, compiled by torch.compile, or compiled ahead of
time and loaded from the user cache. One rule, for ``qkv.generate``, the ``Completer`` and ``qkv generate``.

A compiled step runs a batch-1 token 2-3x faster than the eager one on a CPU, but compiling costs seconds in
every new process; a step compiled ahead of time loads in ~0.1 s, but only where one was built for exactly
these weights, this batch size and this machine (qkv.accel.precompiled). So, by default:

- a package built for the model and the batch size runs from :data:`PRECOMPILED_AFTER` new tokens on;
- otherwise one prompt's steps are compiled from :data:`COMPILE_AFTER` new tokens on, on a CPU with a C++
  compiler, for a model whose steps run fp32 linear maps (not an int8 copy);
- otherwise the steps run eagerly, their weights laid out for this CPU's fastest kernels (qkv.accel.kernels).

``compile=True`` asks for torch.compile's step (one prompt), ``compile=False`` for eager steps only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from torch import nn

from qkv.accel.compiled import check_can_compile, cpu_compiler_available
from qkv.accel.kernels import step_linears
from qkv.accel.precompiled import can_precompile, find, precompile
from qkv.devices import model_device

# From how many new tokens of one prompt a generation compiles its decoding step by default (on a CPU with a
# C++ compiler). Compiling costs ~12 s in a new process even with inductor's disk cache warm (33 s cold) and
# saves ~5 ms a token at the nanoGPT config on a 2-core EPYC (docs/BENCHMARKS.md): it repays itself after
# ~2,000 tokens.
COMPILE_AFTER = 2048
# From how many new tokens a generation runs the step compiled ahead of time, where one was built for the
# model, the batch size and this machine: loading it takes ~0.1 s once a process, which the 2-3 ms it saves a
# token at the nanoGPT config (docs/BENCHMARKS.md) repay after a few dozen tokens.
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


__all__ = ["COMPILE_AFTER", "PRECOMPILED_AFTER", "Step", "StepPolicy"]
