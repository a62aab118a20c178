"""Which step a GPT's generation runs after its prompt: eager, compiled by torch.compile, or compiled ahead of time
and loaded from the user cache. qkv.accel offers the three; this rule picks, once a generation, for
``qkv.generate``, the ``Completer`` and ``qkv generate`` alike (:meth:`StepPolicy.choose`).

A compiled step runs a batch-1 token faster than the eager one on a CPU, but compiling costs seconds in every new
process; a step compiled ahead of time loads in a fraction of a second, but only where one was built for exactly
these weights, this batch size and this machine (the figures: docs/BENCHMARKS.md, "GPT generation"). So, by
default (``compile=None``):

- a package built for the model and the batch size runs from ``PRECOMPILED_AFTER`` new tokens on;
- otherwise one prompt's steps are compiled from ``COMPILE_AFTER`` new tokens on, on a CPU with a C++ compiler,
  for a model whose steps run fp32 linear maps (not an int8 copy);
- otherwise the steps run eagerly, their weights laid out for this CPU's fastest kernels (qkv.accel.kernels); where
  a package would have run, the choice says so (``Step.build``), and whoever chose the step builds one in the
  background once the generation is over (:meth:`StepPolicy.build_later`, the one place a build starts from):
  ``qkv.generate`` and the ``Completer`` where they chose it, ``qkv generate`` for its batch sizes. The Python
  API says so by a :class:`PrecompileNotice` warning, the command on stderr.

``compile=True`` asks for torch.compile's step (one prompt), ``compile=False`` for eager steps only.

A model that something looks into (:func:`looked_at`: a hook on one of its modules, as
``qkv.interpret.heads_off`` puts on W^O, or ``capture_attention`` open) decodes eagerly whatever ``compile``
says short of True, which it refuses: a compiled graph runs no hook registered after it was compiled (the one
graph serves every generation), a package runs none, and neither reports its attention.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal, NamedTuple

from torch import nn

from qkv.accel.compiled import check_can_compile, cpu_compiler_available
from qkv.accel.kernels import step_linears
from qkv.accel.precompiled import Later, build_later, can_precompile, find, precompile
from qkv.devices import model_device
from qkv.modules.attention import attention_observer

# From how many new tokens of one prompt a generation compiles its decoding step by default (on a CPU with a
# C++ compiler): where the milliseconds it saves a token repay the seconds of compiling in a new process, warm
# inductor cache or not (docs/BENCHMARKS.md, "Compiled in the process").
COMPILE_AFTER = 2048
# From how many new tokens a generation runs the step compiled ahead of time, where one was built for the
# model, the batch size and this machine: loading it costs once a process what the milliseconds it saves a
# token repay after a few dozen tokens (docs/BENCHMARKS.md, "Compiled ahead of time and loaded").
PRECOMPILED_AFTER = 32

How = Literal["eager", "compiled", "loaded"]


class PrecompileNotice(UserWarning):
    """A generation of the Python API started building its step ahead of time in the background, or such a
    build failed (``warnings.simplefilter("ignore", PrecompileNotice)`` hides it; ``QKV_BACKGROUND_PRECOMPILE=0``
    or ``compile=False`` starts none)."""


def looked_at(model: nn.Module) -> bool:
    """Whether something looks into ``model``'s steps: a forward hook on one of its modules, or the observer of
    ``capture_attention``. A compiled step would skip it (the module docstring)."""
    return attention_observer.get() is not None or any(m._forward_hooks or m._forward_pre_hooks
                                                        for m in model.modules())


class Step(NamedTuple):
    """The step a generation of ``rows`` prompts runs after its prompt, as :meth:`StepPolicy.choose` chose it."""

    how: How
    rows: int
    package: Path | None = None  # the package a "loaded" step runs
    build: bool = False  # eager where a package built for this model and batch size would have run


class StepPolicy:
    """The decoding step of ``model``'s generations: ``compile`` None (the rule above), True or False.

    Raises ``ValueError`` at once where ``compile=True`` cannot be honoured (no C++ compiler for a CPU).
    """

    def __init__(self, model: nn.Module, compile: bool | None = None) -> None:
        self.model, self.compile = model, compile
        if compile:
            check_can_compile(model_device(model))

    def choose(self, max_new_tokens: int, rows: int = 1) -> Step:
        """The step a generation of ``max_new_tokens`` for ``rows`` prompts runs. The package is looked for here,
        once (and at every call: one built meanwhile, by a background build, is found); the weights are hashed
        at most once while they are unchanged (qkv.accel.precompiled.digest).

        Raises ``ValueError`` where ``compile=True`` meets a model that something looks into (:func:`looked_at`).
        """
        if looked_at(self.model):
            if self.compile:
                raise ValueError("a compiled decoding step runs no hooks and reports no attention (heads_off, "
                                 "capture_attention, a hook of yours); decode eagerly: compile=False or None")
            return Step("eager", rows)
        package = self.package(rows) if self.compile is None and max_new_tokens >= PRECOMPILED_AFTER else None
        if package is not None:
            return Step("loaded", rows, package)
        if self._compiles(max_new_tokens, rows):
            return Step("compiled", rows)
        build = (self.compile is None and max_new_tokens >= PRECOMPILED_AFTER and can_precompile(self.model)
                 and cpu_compiler_available())
        return Step("eager", rows, build=build)

    def package(self, rows: int = 1) -> Path | None:
        """The package of the model's step for ``rows`` prompts, if one was built on this machine for these
        weights."""
        return find(self.model, rows)

    def precompile(self, rows: int = 1) -> tuple[Path, float]:
        """Compile the model's step for ``rows`` prompts ahead of time, unless it was (qkv.accel.precompiled)."""
        return precompile(self.model, rows)

    def build_later(self, step: Step, argv: list[str] | None = None, off: str = "compile=False",
                    here: str = "StepPolicy(model).precompile(rows)") -> Later | None:
        """Once a generation that ran ``step`` is over: where the step calls for a package (``step.build``), start
        building it in the background (qkv.accel.precompiled.build_later; ``argv``: the builder, None for one
        that reads the model from files written beside the package; ``off``, ``here``: how the caller's user
        decodes without it, and builds it in the foreground) and say what became of it; None where it calls for
        none."""
        if not step.build:
            return None
        return build_later(self.model, step.rows, argv, off=off, here=here)

    def notify(self, step: Step) -> None:
        """:meth:`build_later` for the Python API: a :class:`PrecompileNotice` where a build started or failed
        (none where one runs, none was started, or the environment turns them off)."""
        later = self.build_later(step)
        if later is not None and later.news:
            # Past notify, the generation and the wrapper of its @torch.no_grad: the line of the caller.
            warnings.warn(later.line, PrecompileNotice, stacklevel=4)

    def _compiles(self, max_new_tokens: int, rows: int) -> bool:
        """Whether such a generation runs torch.compile's step, where no package runs: one prompt only (larger
        batches decode eagerly, where the weight products dominate)."""
        if rows != 1 or self.compile is False:
            return False
        if self.compile:
            return True
        return (max_new_tokens >= COMPILE_AFTER and model_device(self.model).type == "cpu"
                and bool(step_linears(self.model)) and cpu_compiler_available())

