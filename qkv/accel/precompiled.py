"""A GPT's decoding step compiled ahead of time (AOTInductor), kept on disk, loaded in a fraction of a second.

The compiled step of :mod:`qkv.accel.compiled` runs a batch-1 token faster than the eager step on a
CPU, but a new process pays seconds before its first compiled token (importing dynamo and inductor,
tracing the model, loading the kernels from inductor's disk cache), which only long generations
repay. Here the same step, transformed the same way, is exported once (``torch.export``, with the KV
cache's tensors and the slot as inputs that the step writes in place) and compiled by AOTInductor
into a package in the user cache. A later process loads it with PyTorch's C++ loader, without
importing inductor, so every generation of a few dozen tokens gains (the figures, against eager and
CTranslate2: docs/BENCHMARKS.md, "Compiled ahead of time and loaded"; bench/aot_step.py).

A package is built for one batch size, and serves it over the model's whole context: its shapes are
fixed but for the length of the key mask, the slots written so far (``span``), so that attention reads
no more of the cache than it holds. With every step reading all of the context's slots, as the
in-process step does, the batch-8 step of the nanoGPT config read as many bytes of cache as of
weights and gained nothing on eager; reading the span, and with the weights frozen into the package
too (:data:`PACKAGE_OPTIONS`), it did (docs/BENCHMARKS.md).

A package holds the model's weights and the kernels built for this CPU and torch: its name is a digest
of the model (class, configuration, every weight), the torch version and the CPU
(:func:`~qkv.devices.cpu_identity`), and the batch size, so a changed weight or another machine never loads
a stale one. Building one takes tens of seconds (``qkv generate --precompile``, or :func:`precompile`).
``qkv generate`` builds it by itself, in the background, after an eager generation that a package would have run (as ``git gc --auto`` packs a repository after a command):
:func:`build_in_background` starts the build as a detached process at low priority, and beside the
package it writes a marker with the builder's pid and the builder's log, which the package's arrival
deletes. A build that failed or was stopped leaves them, and none starts again by itself
(:func:`background_build` says what became of it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.errors import ConfigError, DataError
from qkv.accel.compiled import INDUCTOR_OPTIONS, CompiledStep, SlotCache, caches_of, check_can_compile
from qkv.accel.kernels import decoding_model, step_linears
from qkv.devices import cpu_identity
from qkv.files import atomic_path, user_cache
from qkv.models import GPT
from qkv.models.kinds import build_model
from qkv.settings import from_dict, to_dict

# Part of every package's name: raise it when the step's inputs or its transformation change.
FORMAT = 2
# The compiled step's options, and freezing: the weights are the package's constants, so inductor packs
# them for oneDNN ahead of time and fuses the bias, GELU and residual add into each product: faster steps at
# batch 8, nothing measurable at batch 1, where the products stay the multiply-and-sum loops of
# compiled_linear (docs/BENCHMARKS.md, "Compiled ahead of time and loaded").
PACKAGE_OPTIONS = {**INDUCTOR_OPTIONS, "freezing": True}
# How many packages the user cache keeps (one per model, batch size and machine, each holding the model's
# weights): building another deletes the oldest.
PACKAGES_KEPT = 16
# "0" in the environment: no generation builds a package in the background (the test suite sets it).
BACKGROUND_ENV = "QKV_BACKGROUND_PRECOMPILE"
# A background build still marked as running after this long was stopped without a trace (a package takes tens
# of seconds; the marker's pid may belong to another process by then).
BACKGROUND_TIMEOUT = 30 * 60


def digest(model: nn.Module) -> str:
    """What a package is built from: the model's class, configuration and every weight, torch, the CPU.

    Reading every weight takes a while (tens of ms at the nanoGPT config), and every generation long enough
    to load a package asks: the digest is kept for the model while its tensors are the same and unchanged
    (their storage and version counters)."""
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_inference() for t in tensors):  # no version counter to tell a change by
        return _digest(model)
    state = tuple((t.data_ptr(), t._version) for t in tensors)
    kept = _digests.get(model)
    if kept is None or kept[0] != state:
        kept = _digests[model] = (state, _digest(model))
    return kept[1]


_digests: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, str]] = weakref.WeakKeyDictionary()


def _digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT, torch.__version__, cpu_identity(), type(model).__name__, repr(model.cfg),
                         PACKAGE_OPTIONS]).encode())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())  # any dtype, as bytes
    return h.hexdigest()[:32]


def package_path(model: nn.Module, batch: int = 1) -> Path:
    """Where the package of ``model``'s step for ``batch`` rows is kept: ``steps/DIGEST-BATCH.pt2`` in the user
    cache (a step's shapes are fixed but for the keys it reads: one package for each batch size)."""
    return user_cache("steps", f"{digest(model)}-{batch}.pt2")


def cache_slots(model: nn.Module) -> int:
    """The slots of the KV caches a package's step runs on: the model's context and one more, so that the
    keys attention reads (the first ``span`` slots, at most the context) are always a proper part of the
    buffer: export traces a slice of the whole buffer otherwise, and one graph would not serve every span."""
    return model.cfg.max_len + 1


def can_precompile(model: nn.Module) -> bool:
    """Whether ``model``'s step can be compiled ahead of time: a GPT's fp32 linear maps on a CPU (in training mode
    too: the step is built from a decoding copy, in eval mode)."""
    if not isinstance(model, GPT):
        return False
    device = next(model.parameters()).device
    return (device.type == "cpu" and bool(step_linears(model))
            and all(m.weight.dtype == torch.float32 for m in step_linears(model)))


def find(model: nn.Module, batch: int = 1) -> Path | None:
    """The package of ``model``'s step for ``batch`` rows, if one was built on this machine for exactly these
    weights."""
    folder = user_cache("steps")
    if not folder.is_dir() or not any(folder.glob(f"*-{batch}.pt2")) or not can_precompile(model):
        return None  # no digest to compute (it reads every weight) where nothing could match
    path = package_path(model, batch)
    return path if path.is_file() else None


class _Step(nn.Module):
    """The step with every input explicit, as the package runs it: the tokens, their positions, the key mask
    over the slots written so far (its length, ``span``, is the one size that varies from step to step), the
    cache slot, and each self-attention cache's keys and values, which the step writes at the slot.

    ``model``: a compiled step's model (``CompiledStep.model``): the step passes it a cache per layer over the
    keys and values it is given, the inputs export traces (the model's own caches are not read)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor, slot: Tensor, *kv: Tensor) -> Tensor:
        span = mask.shape[-1]  # mask (B, 1, 1, span): attention reads the first span slots, not all of them
        caches = [SlotCache(k, v, slot, span=span) for k, v in zip(kv[0::2], kv[1::2])]  # (B, H, L + 1, d_k | d_v)
        return self.model(tokens, mask=mask, positions=positions, caches=caches)  # (B, 1, V)


@torch.no_grad()
def precompile(model: nn.Module, batch: int = 1) -> tuple[Path, float]:
    """Build the package of ``model``'s step for ``batch`` rows (tens of seconds) unless it exists; return its
    path and the seconds spent (0 if it was there)."""
    if not can_precompile(model):
        raise ConfigError("only an fp32 GPT on a CPU has a decoding step that can be compiled "
                          "ahead of time (not an int8 one: drop --quantize)")
    if batch < 1:
        raise ConfigError(f"a decoding step serves 1 or more rows, got a batch of {batch}")
    path = package_path(model, batch)
    if path.is_file():
        _clear_background_build(path)
        return path, 0.0
    check_can_compile(torch.device("cpu"))
    from torch._inductor import aoti_compile_and_package  # here only: seconds to import, which loading never pays
    t0 = time.perf_counter()
    max_len = model.cfg.max_len
    twin = decoding_model(model, batch, cache_slots(model), packed=False)
    step = CompiledStep(twin, torch.ones(batch, 1, dtype=torch.bool))  # its step model, not compiled here
    kv = [t for c in caches_of(step.model) for t in (c.k, c.v)]
    # The mask contiguous, as LoadedStep passes it: the package's code takes the example's strides
    # (a view of `visible` would have rows max_len + 1 apart, where the step's are span apart).
    mask = step.visible[:, None, None, :max_len].contiguous()  # (B, 1, 1, span)
    example = (torch.zeros(batch, 1, dtype=torch.long), torch.zeros(batch, 1, dtype=torch.long), mask,
               step.slot, *kv)
    # Every size fixed but the span: from the first step after a one-token prompt to max_len.
    span = {3: torch.export.Dim("span", min=2, max=max_len)}
    with warnings.catch_warnings():  # torch's own deprecations inside export, nothing the user can act on
        warnings.simplefilter("ignore", FutureWarning)
        exported = torch.export.export(_Step(step.model), example, strict=False,
                                       dynamic_shapes=(None, None, span, None, tuple(None for _ in kv)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, warnings.catch_warnings():  # a package is there whole or not at all
        warnings.simplefilter("ignore", FutureWarning)
        built = aoti_compile_and_package(exported, package_path=str(tmp) + ".pt2",
                                         inductor_configs=dict(PACKAGE_OPTIONS))
        os.replace(built, tmp)
    _clear_background_build(path)
    prune(path.parent, PACKAGES_KEPT)
    return path, time.perf_counter() - t0


def _side_files(path: Path) -> tuple[Path, Path]:
    """The files a background build of the package ``path`` keeps beside it: its marker (the builder's pid) and
    its log (the builder's stderr)."""
    return path.with_suffix(".building"), path.with_suffix(".log")


def _clear_background_build(path: Path) -> None:
    for side in _side_files(path):
        side.unlink(missing_ok=True)


class BackgroundBuild(NamedTuple):
    """A build of a package started in the background that has not delivered it (:func:`background_build`)."""

    pid: int | None  # the builder's process (None while it is being started)
    running: bool  # False: it failed or was stopped; ``log`` says how, and no build starts again by itself
    log: Path  # the builder's stderr


def background_build(path: Path) -> BackgroundBuild | None:
    """What became of a background build of the package ``path``: None if none was started or it delivered the
    package (which deletes its marker), else the build, running or not."""
    marker, log = _side_files(path)
    try:
        text, age = marker.read_text().strip(), time.time() - marker.stat().st_mtime
    except OSError:  # none (or no cache folder to hold one)
        return None
    pid = int(text) if text.isdigit() else None  # None: the marker is written before its pid (a build starting)
    return BackgroundBuild(pid, age < BACKGROUND_TIMEOUT and (pid is None or _alive(pid)), log)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (where that cannot be asked, as on Windows, whose os.kill would end it:
    True, and the marker's age decides)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)  # signal 0: nothing sent, only whether the process exists
    except (ProcessLookupError, PermissionError):  # gone, or another user's: not our builder any more
        return False
    return True


def build_in_background(path: Path, argv: list[str], prepare: Callable[[], None] | None = None) -> int | None:
    """Start ``argv``, a command that builds the package ``path``, as a detached process at low priority (it
    outlives its parent and yields the CPU to the user's work), unless a build of ``path`` was started before;
    return the builder's pid, or None if it was not started. ``prepare`` runs first, once the build is this
    one's (it writes what the builder reads).

    One build per package: the marker is created exclusively, so of two generations that end together only
    one starts a build, and a build that failed is not retried by itself (:func:`background_build`; a
    foreground :func:`precompile` that succeeds clears it)."""
    marker, log = _side_files(path)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except OSError:  # a build started before (the marker exists), or a cache that cannot be written
        return None
    nice = shutil.which("nice")
    try:
        with os.fdopen(fd, "w") as pid_file, open(log, "wb") as err:
            if prepare is not None:
                prepare()
            builder = subprocess.Popen([nice, "-n", "10", *argv] if nice else argv, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            pid_file.write(str(builder.pid))
    except OSError:  # nothing started: no marker left to stop the next generation from trying
        marker.unlink(missing_ok=True)
        return None
    return builder.pid


class Later(NamedTuple):
    """What :func:`build_later` did: the line that says so, and whether it is news to its user (a build started
    now, or one that failed) rather than a build already under way or none at all."""

    line: str
    news: bool


def build_later(model: nn.Module, rows: int, argv: list[str] | None = None, off: str = "compile=False",
                here: str = "StepPolicy(model).precompile(rows)") -> Later:
    """After an eager generation that a package of the step would have run: build the package in the background
    (:func:`build_in_background`), as ``git gc --auto`` packs a repository after a command, so that the next
    generation loads it; return the line that says so, or why not (one was started before, the environment
    turns it off, an earlier build failed), as a :class:`Later`. ``argv``: a command that builds it (``qkv generate`` passes itself,
    on the run's files); None, the Python API's: :func:`build_from_input`, on the model's configuration and
    weights written beside the package. ``off`` and ``here`` name, in the caller's words, how to decode without
    it and how to build it in the foreground."""
    path = package_path(model, rows)
    build = background_build(path)
    speedup = "later generations run it, faster"
    if build is None and os.environ.get(BACKGROUND_ENV) != "0":
        pid = build_in_background(path, argv or _builder(path, rows),
                                  None if argv else lambda: _write_input(model, path))
        if pid is not None:
            return Later(f"decoded eagerly; compiling this model's step for this machine and batch size in the "
                         f"background, at low priority (pid {pid}; tens of seconds): {speedup}. {BACKGROUND_ENV}=0 or "
                         f"{off}: not in the background", True)
        build = background_build(path)  # another generation started one meanwhile
    if build is None:
        return Later(f"decoded eagerly; {here} once compiles this model's step for this machine and batch size "
                     f"(tens of seconds), and {speedup}", False)
    if build.running:
        return Later(f"decoded eagerly; this model's step is being compiled in the background"
                     f"{f' (pid {build.pid})' if build.pid else ''}: {speedup}", False)
    return Later(f"decoded eagerly; compiling this model's step in the background failed or was stopped (its log: "
                 f"{build.log}); {here} compiles it here and says why it fails", True)


def _input_of(path: Path) -> Path:
    """The folder beside the package ``path`` that holds the model a builder of the Python API's reads."""
    return path.with_suffix(".input")


def _write_input(model: nn.Module, path: Path) -> None:
    """The model's configuration and weights (safetensors, tied weights stored once), for :func:`build_from_input`."""
    from safetensors.torch import save_model

    folder = _input_of(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / "weights.safetensors"))
    (folder / "model.json").write_text(json.dumps(to_dict(model.cfg)), encoding="utf-8")


def _builder(path: Path, rows: int) -> list[str]:
    """The command that builds the package ``path`` from the model written beside it (:func:`build_from_input`)."""
    code = "import sys; from qkv.accel.precompiled import build_from_input; build_from_input(sys.argv[1], int(sys.argv[2]))"
    return [sys.executable, "-c", code, str(path), str(rows)]


def build_from_input(path: str | Path, rows: int) -> Path:
    """Build the package ``path`` for ``rows`` rows from the model written beside it by a generation of the
    Python API (:func:`build_later`), which it then deletes; what a background builder runs."""
    from safetensors.torch import load_model

    path = Path(path)
    folder = _input_of(path)
    try:
        cfg = from_dict(ModelConfig, json.loads((folder / "model.json").read_text(encoding="utf-8")))
        model = build_model(cfg).eval()
        load_model(model, str(folder / "weights.safetensors"))
        if package_path(model, rows) != path:  # the digest of what was read: the model the package is for
            raise DataError(f"{folder}: the model read back is not the one whose step {path.name} was asked for")
        return precompile(model, rows)[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def prune(folder: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest packages in ``folder`` (by when they were built), so that the user
    cache does not grow with every model, batch size and machine a package was ever built for."""
    built = []
    for package in folder.glob("*.pt2"):
        try:
            built.append((package.stat().st_mtime_ns, package))
        except FileNotFoundError:  # pruned meanwhile by another process
            continue
    for _, old in sorted(built, reverse=True)[keep:]:
        old.unlink(missing_ok=True)


@functools.lru_cache(maxsize=2)
def _loader(package: str, mtime_ns: int, size: int) -> Any:
    """The package's loaded step, kept for the process while the file is unchanged (``mtime_ns``, ``size``):
    loading reads the package (its weights and kernels), which every generation of a Completer paid again."""
    try:
        return torch._C._aoti.AOTIModelPackageLoader(package, "model", False, 1, -1)
    except RuntimeError as e:  # a damaged package: built whole (atomically), but a disk can fail
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{package}: the decoding step compiled ahead of time could not be loaded ({reason}); "
                        "delete the file (qkv generate --precompile builds it again), or decode with "
                        "--no-compile") from None


class LoadedStep(CompiledStep):
    """:class:`~qkv.accel.compiled.CompiledStep` with the package's step in place of torch.compile's.

    The model must have its caches of :func:`cache_slots` positions set up for the package's batch size, the
    prompt prefilled; ``package``: from :func:`find`.
    """

    needs_compiler = False  # the package holds the built kernels

    def __init__(self, model: nn.Module, prompt: Tensor, package: Path) -> None:
        if not package.name.endswith(f"-{prompt.shape[0]}.pt2"):
            raise ValueError(f"{package} is a step for another batch size than {prompt.shape[0]} rows "
                             "(precompiled.find(model, batch) finds the one for a batch)")
        self.package = package
        self.kv = [t for c in caches_of(model) for t in (c.k, c.v)]
        super().__init__(model, prompt)

    def compile(self, model: nn.Module) -> Any:
        found = self.package.stat()  # a package rewritten since (built anew, or damaged) is loaded anew
        return _loader(str(self.package), found.st_mtime_ns, found.st_size)

    def __call__(self, tokens: Tensor, positions: Tensor, slot: int) -> Tensor:
        """tokens, positions: (B, 1); slot: the cache slot the tokens go to. Returns (B, 1, V) logits."""
        self.slot.fill_(slot)
        self.visible[:, slot] = True
        mask = self.visible[:, None, None, :slot + 1].contiguous()  # (B, 1, 1, span): the slots written so far
        return self.run.run([tokens, positions, mask, self.slot, *self.kv])[0]  # run: the package's loader


__all__ = ["FORMAT", "PACKAGE_OPTIONS", "PACKAGES_KEPT", "BACKGROUND_ENV", "BACKGROUND_TIMEOUT", "digest", "package_path", "cache_slots",
           "can_precompile", "find", "precompile", "prune", "BackgroundBuild", "background_build", "build_in_background", "Later", "build_later", "build_from_input",
           "LoadedStep"]
