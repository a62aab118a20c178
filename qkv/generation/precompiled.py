"""A GPT's decoding step compiled ahead of time (AOTInductor), kept on disk, loaded in a tenth of a second.

The compiled step of :mod:`qkv.generation.compiled` runs a batch-1 token about 1.5x faster than the
eager step on a CPU, but a new process pays ~8 s before its first compiled token (importing dynamo
and inductor, tracing the model, loading the kernels from inductor's disk cache), which only long
generations repay. Here the same step, transformed the same way, is exported once
(``torch.export``, with the KV cache's tensors and the slot as inputs that the step writes in place)
and compiled by AOTInductor into a package in the user cache. A later process loads it with
PyTorch's C++ loader in ~0.1 s, without importing inductor, so every generation of a few dozen tokens
gains: on a 2-core AMD EPYC, 6.6 ms a token against 9.7 eager and CTranslate2's 7.6, and `qkv
generate` as a whole at 1.05x CTranslate2 (bench/aot_step.py, docs/BENCHMARKS.md).

A package holds the model's weights and the kernels built for this CPU and torch: its name is a digest
of the model (class, configuration, every weight), the torch version and the CPU
(:func:`~qkv.io.cpu_identity`), so a changed weight or another machine never loads a stale one.
Building one takes 20-40 s at the nanoGPT config (``qkv generate --precompile``, or :func:`precompile`);
it serves generations of one prompt over the model's whole context.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.config import ConfigError
from qkv.generation.compiled import INDUCTOR_OPTIONS, CompiledStep, caches_of, check_can_compile
from qkv.generation.kernels import end_decoding, start_decoding, step_linears
from qkv.io import DataError, atomic_path, cpu_identity, user_cache
from qkv.models import GPT

# Part of every package's name: raise it when the step's inputs or its transformation change.
FORMAT = 1


def digest(model: nn.Module) -> str:
    """What a package is built from: the model's class, configuration and every weight, torch, the CPU."""
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT, torch.__version__, cpu_identity(), type(model).__name__, repr(model.cfg),
                         INDUCTOR_OPTIONS]).encode())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())  # any dtype, as bytes
    return h.hexdigest()[:32]


def package_path(model: nn.Module) -> Path:
    """Where the package of ``model``'s step is kept: ``steps/DIGEST.pt2`` in the user cache."""
    return user_cache("steps", f"{digest(model)}.pt2")


def can_precompile(model: nn.Module) -> bool:
    """Whether ``model``'s step can be compiled ahead of time: a GPT's fp32 linear maps on a CPU, in eval mode."""
    if not isinstance(model, GPT):
        return False
    device = next(model.parameters()).device
    return (device.type == "cpu" and not model.training and bool(step_linears(model))
            and all(m.weight.dtype == torch.float32 for m in step_linears(model)))


def find(model: nn.Module) -> Path | None:
    """The package of ``model``'s step, if one was built on this machine for exactly these weights."""
    folder = user_cache("steps")
    if not folder.is_dir() or not any(folder.glob("*.pt2")) or not can_precompile(model):
        return None  # no digest to compute (it reads every weight) where nothing could match
    path = package_path(model)
    return path if path.is_file() else None


class _Step(nn.Module):
    """The step with every input explicit, as the package runs it: the token, its position, the key mask,
    the cache slot, and each self-attention cache's keys and values, which the step writes at the slot."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor, slot: Tensor, *kv: Tensor) -> Tensor:
        for cache, k, v in zip(caches_of(self.model), kv[0::2], kv[1::2]):
            cache.k, cache.v, cache.slot = k, v, slot  # (1, H, L, Dh) each, written in place at the slot
        return self.model(tokens, mask=mask, positions=positions)  # (1, 1, V)


@torch.no_grad()
def precompile(model: nn.Module) -> tuple[Path, float]:
    """Build the package of ``model``'s step (20-40 s at the nanoGPT config) unless it exists;
    return its path and the seconds spent (0 if it was there)."""
    if not can_precompile(model):
        raise ConfigError("only an fp32 GPT on a CPU, in eval mode, has a decoding step that can be compiled "
                          "ahead of time (not an int8 one: drop --quantize)")
    path = package_path(model)
    if path.is_file():
        return path, 0.0
    check_can_compile(torch.device("cpu"))
    from torch._inductor import aoti_compile_and_package  # here only: 2.7 s to import, which loading never pays
    t0 = time.perf_counter()
    start_decoding(model, 1, model.cfg.max_len, packed=False)
    try:
        step = CompiledStep(model, torch.ones(1, 1, dtype=torch.bool))  # the transformation; torch.compile is lazy
        try:
            kv = [t for c in caches_of(model) for t in (c.k, c.v)]
            example = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long),
                       step.visible[:, None, None, :], step.slot, *kv)
            with warnings.catch_warnings():  # torch's own deprecations inside export, nothing the user can act on
                warnings.simplefilter("ignore", FutureWarning)
                exported = torch.export.export(_Step(model), example, strict=False)
        finally:
            step.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, warnings.catch_warnings():  # a package is there whole or not at all
            warnings.simplefilter("ignore", FutureWarning)
            built = aoti_compile_and_package(exported, package_path=str(tmp) + ".pt2",
                                             inductor_configs=dict(INDUCTOR_OPTIONS))
            os.replace(built, tmp)
    finally:
        end_decoding(model)
    return path, time.perf_counter() - t0


@functools.lru_cache(maxsize=2)
def _loader(package: str, mtime_ns: int, size: int) -> Any:
    """The package's loaded step, kept for the process while the file is unchanged (``mtime_ns``, ``size``):
    loading reads the package (its weights and kernels), 55 ms at the nanoGPT config, which every
    generation of a Completer paid again (0.3 ms a token at 200)."""
    try:
        return torch._C._aoti.AOTIModelPackageLoader(package, "model", False, 1, -1)
    except RuntimeError as e:  # a damaged package: built whole (atomically), but a disk can fail
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{package}: the decoding step compiled ahead of time could not be loaded ({reason}); "
                        "delete the file (qkv generate --precompile builds it again), or decode with "
                        "--no-compile") from None


class LoadedStep(CompiledStep):
    """:class:`~qkv.generation.compiled.CompiledStep` with the package's step in place of torch.compile's.

    The model must have its caches of ``model.cfg.max_len`` positions set up (the package's shapes), the
    prompt prefilled; ``package``: from :func:`find`.
    """

    needs_compiler = False  # the package holds the built kernels

    def __init__(self, model: nn.Module, prompt: Tensor, package: Path) -> None:
        self.package = package
        super().__init__(model, prompt)

    def compile(self, model: nn.Module):
        found = self.package.stat()  # a package rewritten since (built anew, or damaged) is loaded anew
        loader = _loader(str(self.package), found.st_mtime_ns, found.st_size)
        kv = [t for c in caches_of(model) for t in (c.k, c.v)]
        slot = self.slot

        def forward(tokens: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
            return loader.run([tokens, positions, mask, slot, *kv])[0]  # (1, 1, V)

        return forward


__all__ = ["FORMAT", "digest", "package_path", "can_precompile", "find", "precompile", "LoadedStep"]
