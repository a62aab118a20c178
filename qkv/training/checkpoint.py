"""Checkpoints in a run directory: weights in safetensors, trainer state in a weights-only ``.pt``, written atomically.

A checkpoint ``NAME`` in ``run_dir`` is two files:

- ``NAME.safetensors``: the model weights (``safetensors.torch.save_model``, which stores a tied
  embedding / output projection once and restores the tie on load);
- ``NAME.pt``: the trainer state (optimizer state, RNG states, and the caller's own ``state``: step,
  schedule, data position), loadable with ``torch.load(weights_only=True)``, so loading never runs
  pickled code.

Every file is written to a temporary name in the same directory, flushed to disk, then renamed over
the old one with ``os.replace`` (atomic on POSIX and Windows): a kill at any moment leaves either the
old file or the new one, never half of one. Both files of a checkpoint are written before either is
renamed, so a failed save leaves the previous checkpoint whole; both carry the same checkpoint id, so a
kill in the microseconds between the two renames is detected on load instead of resuming new weights
with an old optimizer.

``--resume`` wants :func:`load_checkpoint` (everything); ``--init-from`` (fine-tuning) wants
:func:`load_weights` alone, with a fresh optimizer.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

WEIGHTS_SUFFIX = ".safetensors"
STATE_SUFFIX = ".pt"
STATE_FORMAT = "qkv-trainer-state"
STATE_VERSION = 1
# Key of the checkpoint id in the safetensors metadata; the same id is stored in the state file.
_ID_KEY = "qkv_checkpoint_id"

# The weights a run directory may hold, by name: the trainer's final choice, the best and last
# checkpoints, and the average of the last K (Section 6.1). `--weights NAME` picks one.
RUN_WEIGHTS = ("model", "best", "last", "average")


def run_weights(run_dir: str | Path, which: str | Path | None = None) -> Path | None:
    """The weights file of a run: ``which`` names one of :data:`RUN_WEIGHTS` (anything else is a path).

    ``None`` means the weights a run is used with: ``model``, else ``best``, else ``last`` (a run
    stopped before its end); it gives None when there are none. A named file is returned even if absent.
    """
    run_dir = Path(run_dir)
    if which is None:
        return next((run_dir / f"{n}{WEIGHTS_SUFFIX}" for n in ("model", "best", "last")
                     if (run_dir / f"{n}{WEIGHTS_SUFFIX}").is_file()), None)
    return run_dir / f"{which}{WEIGHTS_SUFFIX}" if str(which) in RUN_WEIGHTS else Path(which)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or loaded: missing, mismatched or inconsistent files."""


# ----------------------------------------------------------------------------------------------
# Atomic writes


def _fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not possible on every platform (e.g. Windows), hence best effort.
    try:
        _fsync_file(path)
    except OSError:
        pass


def _remove_stale_temps(path: Path) -> None:
    """Delete temporary files left for ``path`` by processes that were killed mid-write."""
    if os.name != "posix":  # os.kill(pid, 0) is a liveness probe only on POSIX
        return
    pattern = re.compile(re.escape(f".{path.name}.tmp-") + r"(\d+)-[0-9a-f]+$")
    for other in path.parent.glob(f".{path.name}.tmp-*"):
        m = pattern.match(other.name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)  # still running: maybe another process writing; leave it
            continue
        except ProcessLookupError:
            pass
        except (PermissionError, OSError):
            continue
        with contextlib.suppress(OSError):
            other.unlink()


@contextlib.contextmanager
def atomic_paths(*paths: str | Path) -> Iterator[list[Path]]:
    """Yield temporary paths beside ``paths``; when all are written, move each over its target, in order.

    Nothing is renamed until every temporary file is complete and flushed, so a failure while writing
    any of them (an exception, a full disk) leaves all the targets as they were; the temporary files
    are deleted.

    Example:
        >>> with atomic_paths("run/a.safetensors", "run/a.pt") as (tmp_w, tmp_s):  # doctest: +SKIP
        ...     write_weights(tmp_w); write_state(tmp_s)

    Args:
        *paths: The final files. Their directories are created if needed.

    Yields:
        One temporary path per target, in the same directory (a rename across file systems would not
        be atomic).
    """
    targets = [Path(p) for p in paths]
    temps = []
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(path)
        temps.append(path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield temps
        for path, tmp in zip(targets, temps):
            if not tmp.exists():
                raise CheckpointError(f"{path}: the writer did not create the temporary file {tmp}")
            _fsync_file(tmp)  # data on disk before the rename makes it visible
        for path, tmp in zip(targets, temps):
            os.replace(tmp, path)
    except BaseException:  # also KeyboardInterrupt: never leave a temporary file behind
        for tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    for parent in {p.parent for p in targets}:
        _fsync_dir(parent)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """:func:`atomic_paths` for one file: yield a temporary path, moved over ``path`` on success."""
    with atomic_paths(path) as (tmp,):
        yield tmp


# ----------------------------------------------------------------------------------------------
# Weights


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module under DistributedDataParallel and ``torch.compile`` wrappers, whose names carry no prefix.

    Saving the wrapper would prefix every key with ``module.`` or ``_orig_mod.``, and the file would
    not load into a plain model.
    """
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            return model


def _aliases(state_dict: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """Group state-dict names that are views of the same memory (tied weights), each group sorted."""
    groups: dict[tuple, list[str]] = {}
    for name, t in state_dict.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        groups.setdefault(key, []).append(name)
    return [sorted(g) for g in groups.values()]


def _short(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def load_state_dict_into(
    model: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    strict: bool = True,
    source: str = "state dict",
) -> tuple[list[str], list[str]]:
    """Copy ``state_dict`` into ``model``, accepting one name for each group of tied parameters.

    A tied embedding / output projection is stored once (under either name); the other name is not
    missing. Shape mismatches are always an error (loading a differently shaped model is never what
    was meant); missing and unexpected keys are an error when ``strict``.

    Args:
        model: The module to load into (its tensors keep their device; values are copied in).
        state_dict: Name to tensor.
        strict: Raise on missing or unexpected keys.
        source: Where the tensors come from (a file path), for error messages.

    Returns:
        ``(missing, unexpected)`` key lists (both empty when ``strict`` succeeded).

    Raises:
        CheckpointError: Listing every missing key, unexpected key and shape mismatch.
    """
    model = unwrap_model(model)
    own = model.state_dict()
    missing, mismatched = [], []
    for group in _aliases(own):
        present = [n for n in group if n in state_dict]
        if not present:
            missing.append(group[0] if len(group) == 1 else f"{group[0]} (tied with {', '.join(group[1:])})")
        elif len(present) > 1 and strict:
            first = state_dict[present[0]]
            for other in present[1:]:
                if not torch.equal(first, state_dict[other]):
                    mismatched.append(
                        f"{present[0]} and {other} are tied in the model but differ in the file "
                        "(the file was saved from an untied model)"
                    )
    unexpected = sorted(k for k in state_dict if k not in own)
    for name, t in state_dict.items():
        if name in own and tuple(t.shape) != tuple(own[name].shape):
            mismatched.append(f"{name}: file {tuple(t.shape)} vs model {tuple(own[name].shape)}")
    if mismatched or (strict and (missing or unexpected)):
        lines = [f"{source}: cannot load into {type(model).__name__}:"]
        if missing:
            lines.append(f"  missing keys (in the model, not in the file): {_short(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys (in the file, not in the model): {_short(unexpected)}")
        if mismatched:
            lines.append(f"  shape mismatches: {_short(mismatched)}")
        raise CheckpointError("\n".join(lines))
    # strict=False: tied aliases that the file does not name are reported missing by torch, though
    # loading their twin filled them; the lists above are the true ones.
    model.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)
    return missing, unexpected


def save_weights(path: str | Path, model: nn.Module, metadata: Mapping[str, str] | None = None) -> Path:
    """Write the model's weights to a safetensors file, atomically; tied tensors are stored once.

    Args:
        path: Target ``.safetensors`` file.
        model: The module to save.
        metadata: Extra string-to-string entries for the file header.

    Returns:
        The path written.
    """
    from safetensors.torch import save_model

    path = Path(path)
    with atomic_path(path) as tmp:
        save_model(unwrap_model(model), str(tmp), metadata=dict(metadata) if metadata else None)
    return path


def _read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    try:
        tensors = load_file(str(path), device="cpu")
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    return tensors, metadata


def load_weights(path: str | Path, model: nn.Module, strict: bool = True) -> tuple[list[str], list[str]]:
    """Load a safetensors file into ``model`` (restoring ties); see :func:`load_state_dict_into` for errors.

    Args:
        path: A ``.safetensors`` file.
        model: The module to load into.
        strict: Raise on missing or unexpected keys.

    Returns:
        ``(missing, unexpected)`` key lists.
    """
    path = Path(path)
    tensors, _ = _read_weights(path)
    return load_state_dict_into(model, tensors, strict=strict, source=str(path))


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """Average the weights of several safetensors files (the paper averages the last 5 checkpoints, Section 6.1).

    Floating-point tensors are averaged in float64 and cast back to their dtype; other tensors
    (integer buffers) must be equal and are kept as they are.

    Args:
        paths: Weight files of the same model.

    Returns:
        Name to averaged tensor, ready for :func:`load_state_dict_into`.
    """
    if not paths:
        raise ValueError("average_checkpoints: no paths given")
    first_path = Path(paths[0])
    first, _ = _read_weights(first_path)
    sums = {k: v.double() if v.is_floating_point() else v for k, v in first.items()}
    for p in paths[1:]:
        p = Path(p)
        tensors, _ = _read_weights(p)
        if tensors.keys() != first.keys():
            extra = sorted(tensors.keys() - first.keys())
            lacking = sorted(first.keys() - tensors.keys())
            raise CheckpointError(
                f"{p}: keys differ from {first_path}: extra {_short(extra)}; lacking {_short(lacking)}"
            )
        for k, v in tensors.items():
            if v.shape != first[k].shape:
                raise CheckpointError(f"{p}: {k} has shape {tuple(v.shape)}, {first_path} has {tuple(first[k].shape)}")
            if v.is_floating_point():
                sums[k] += v.double()
            elif not torch.equal(v, first[k]):
                raise CheckpointError(f"{p}: non-float tensor {k} differs from {first_path}; cannot average it")
    n = len(paths)
    return {k: (s / n).to(first[k].dtype) if first[k].is_floating_point() else s for k, s in sums.items()}


# ----------------------------------------------------------------------------------------------
# Random number generators


def capture_rng_state() -> dict[str, Any]:
    """The state of every global generator: torch CPU, CUDA (when in use), Python ``random``, NumPy.

    NumPy's state is stored as tensors and numbers, because a NumPy array fails
    ``torch.load(weights_only=True)``.
    """
    _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back the generators saved by :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    cuda = state.get("cuda")
    if cuda is not None:
        if not torch.cuda.is_available():
            warnings.warn("checkpoint holds CUDA RNG states but CUDA is not available: not restored", stacklevel=2)
        elif len(cuda) != torch.cuda.device_count():
            warnings.warn(
                f"checkpoint holds {len(cuda)} CUDA RNG states for {torch.cuda.device_count()} devices: not restored",
                stacklevel=2,
            )
        else:
            torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------------------------
# Checkpoints: weights + trainer state

_LEAF_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.Tensor, torch.Size, torch.dtype, torch.device)


def _check_loadable(value: Any, where: str) -> None:
    """Raise if ``value`` holds something ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise CheckpointError(f"{where}: key {k!r} is a {type(k).__name__}; use str or int keys")
            _check_loadable(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        for i, v in enumerate(value):
            _check_loadable(v, f"{where}[{i}]")
    elif not isinstance(value, _LEAF_TYPES):
        hint = " (convert it with torch.from_numpy or .item())" if type(value).__module__ == "numpy" else ""
        raise CheckpointError(
            f"{where} is a {type(value).__module__}.{type(value).__name__}, which "
            f"torch.load(weights_only=True) cannot read{hint}"
        )


def checkpoint_paths(run_dir: str | Path, name: str) -> tuple[Path, Path]:
    """The ``(weights, trainer state)`` files of checkpoint ``name`` in ``run_dir``."""
    run_dir = Path(run_dir)
    return run_dir / f"{name}{WEIGHTS_SUFFIX}", run_dir / f"{name}{STATE_SUFFIX}"


def save_checkpoint(
    run_dir: str | Path,
    name: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write checkpoint ``name``: weights, optimizer state, RNG states and the caller's ``state``.

    Args:
        run_dir: The run directory (created if needed).
        name: Checkpoint name, e.g. ``"last"`` or ``"step_001000"``.
        model: The module whose weights are saved.
        optimizer: Its optimizer, for an exact resume.
        state: Whatever else a resume needs, e.g. ``{"step": 1000, "schedule": {...}, "data": {...}}``;
            tensors, numbers, strings and containers of them only (checked here, with the key named).

    Returns:
        The weights path.
    """
    if "/" in name or "\\" in name or not name:
        raise ValueError(f"save_checkpoint: name must be a plain file stem, got {name!r}")
    user_state = dict(state or {})
    _check_loadable(user_state, "state")
    weights_path, state_path = checkpoint_paths(run_dir, name)
    checkpoint_id = uuid.uuid4().hex
    trainer_state = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "checkpoint_id": checkpoint_id,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "rng": capture_rng_state(),
        "state": user_state,
    }
    from safetensors.torch import save_model

    # Both files are complete on disk before either is renamed; the renames take microseconds, and a
    # kill between them is caught on load by the checkpoint id.
    with atomic_paths(weights_path, state_path) as (tmp_weights, tmp_state):
        save_model(unwrap_model(model), str(tmp_weights), metadata={_ID_KEY: checkpoint_id})
        torch.save(trainer_state, tmp_state)
    return weights_path


def load_checkpoint(
    run_dir: str | Path,
    name: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
    strict: bool = True,
) -> dict[str, Any]:
    """Load checkpoint ``name`` into ``model`` (and ``optimizer``), restore the RNGs, return the caller's state.

    Args:
        run_dir: The run directory.
        name: Checkpoint name.
        model: Module built with the same configuration.
        optimizer: Optimizer built the same way; its state is restored when given.
        restore_rng: Put back the global RNG states (for a bit-exact resume).
        strict: Raise on missing or unexpected weight names.

    Returns:
        The ``state`` passed to :func:`save_checkpoint`.
    """
    weights_path, state_path = checkpoint_paths(run_dir, name)
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: no such trainer-state file (checkpoint {name!r} in {run_dir})")
    try:
        trainer_state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{state_path}: cannot read the trainer state ({e})") from e
    if not isinstance(trainer_state, dict) or trainer_state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{state_path}: not a qkv trainer-state file")
    if trainer_state.get("version") != STATE_VERSION:
        raise CheckpointError(
            f"{state_path}: trainer-state version {trainer_state.get('version')}, this qkv reads {STATE_VERSION}"
        )
    tensors, metadata = _read_weights(weights_path)
    if metadata.get(_ID_KEY) != trainer_state["checkpoint_id"]:
        raise CheckpointError(
            f"{weights_path} and {state_path} belong to different saves (the save was interrupted between "
            "the two files); resume from an earlier checkpoint"
        )
    load_state_dict_into(model, tensors, strict=strict, source=str(weights_path))
    if optimizer is not None:
        if trainer_state["optimizer"] is None:
            raise CheckpointError(f"{state_path}: saved without an optimizer state; cannot restore the optimizer")
        try:
            optimizer.load_state_dict(trainer_state["optimizer"])
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{state_path}: optimizer state does not fit this optimizer ({e})") from e
    if restore_rng:
        restore_rng_state(trainer_state["rng"])
    return trainer_state["state"]


def list_checkpoints(run_dir: str | Path, prefix: str = "") -> list[str]:
    """Names of the complete checkpoints (both files present) in ``run_dir`` starting with ``prefix``.

    Sorted by the number at the end of the name when there is one (``step_900`` before ``step_1000``),
    then by name: ``list_checkpoints(run, "step_")[-5:]`` are the last five.
    """
    run_dir = Path(run_dir)
    names = []
    for p in run_dir.glob(f"{prefix}*{STATE_SUFFIX}"):
        stem = p.name[: -len(STATE_SUFFIX)]
        if (run_dir / f"{stem}{WEIGHTS_SUFFIX}").is_file():
            names.append(stem)

    def key(n: str) -> tuple[int, str]:
        m = re.search(r"(\d+)$", n)
        return (int(m.group(1)) if m else -1, n)

    return sorted(names, key=key)
