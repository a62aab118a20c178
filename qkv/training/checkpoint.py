"""Checkpoints in a run directory: weights in safetensors, trainer state in a weights-only ``.pt``, written atomically.

A checkpoint ``NAME`` in ``run_dir`` is two files:

- ``NAME.safetensors``: the model weights (``safetensors.torch.save_model``, which stores a tied
  embedding / output projection once and restores the tie on load);
- ``NAME.pt``: the trainer state (optimizer state, RNG states, and the caller's own ``state``: step,
  schedule, data position), loadable with ``torch.load(weights_only=True)``, so loading never runs
  pickled code.

Every file is written to a temporary name in the same directory, flushed to disk, then renamed over
the old one with ``os.replace`` (atomic on POSIX and Windows): a kill at any moment leaves either the
old file or the new one, never half of one. Both files of a checkpoint are complete and on disk before
either is renamed, so a failed save leaves the previous checkpoint whole. Both carry the same
checkpoint id: a kill in the microseconds between the two renames leaves the new weights beside the
old state (or the reverse) and the other new file, complete, in its temporary file; loading finds it
by its id and finishes the save (it says so), so the set is atomic: the old checkpoint or the new
one, never a mix.

``--resume`` wants :func:`load_checkpoint` (everything); ``--init-from`` (fine-tuning) wants
:func:`load_weights` alone, with a fresh optimizer.
"""

from __future__ import annotations

import os
import random
import re
import uuid
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import numpy as np
import torch
from torch import nn

from qkv.files import as_os_error, atomic_paths, left_behind
from qkv.weights import WEIGHTS_SUFFIX, CheckpointError, load_state_dict_into, read_weights, write_weights

STATE_SUFFIX = ".pt"
STATE_FORMAT = "qkv-trainer-state"
STATE_VERSION = 1
# Key of the checkpoint id in the safetensors metadata; the same id is stored in the state file.
_ID_KEY = "qkv_checkpoint_id"


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
    # Both files are complete on disk before either is renamed; the renames take microseconds, and a
    # kill between them is caught on load by the checkpoint id.
    with atomic_paths(weights_path, state_path) as (tmp_weights, tmp_state):
        write_weights(model, tmp_weights, metadata={_ID_KEY: checkpoint_id})
        _write_state(trainer_state, tmp_state)
    return weights_path


class _Sink:
    """A file for torch.save that keeps the OSError of a failed write: torch reports a full disk as
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``, which says nothing of why."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def _write_state(state: dict[str, Any], path: Path) -> None:
    """torch.save ``state`` into ``path``; a full disk is an OSError naming ``path``."""
    with as_os_error(path), open(path, "wb") as f:
        sink = _Sink(f)
        try:
            torch.save(state, sink)
        except RuntimeError:
            if sink.error is None:
                raise
            raise sink.error from None


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
    if not state_path.is_file() and weights_path.is_file():  # the first save, killed between its renames?
        _finish_interrupted_save(weights_path, state_path, _weights_id(weights_path), None)
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: no such trainer-state file (checkpoint {name!r} in {run_dir})")
    try:
        trainer_state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch's message is pages long and suggests unsafe loading: not repeated
        raise CheckpointError(f"{state_path}: cannot read the trainer state (the file is damaged or was not written by "
                              f"qkv: {type(e).__name__}); a run cannot resume from it: start again with "
                              "--overwrite, or from its weights with --init-from") from e
    if not isinstance(trainer_state, dict) or trainer_state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{state_path}: not a qkv trainer-state file")
    if trainer_state.get("version") != STATE_VERSION:
        raise CheckpointError(
            f"{state_path}: trainer-state version {trainer_state.get('version')}, this qkv reads {STATE_VERSION}"
        )
    tensors, metadata = read_weights(weights_path)
    if metadata.get(_ID_KEY) != trainer_state["checkpoint_id"]:
        if not _finish_interrupted_save(weights_path, state_path, metadata.get(_ID_KEY), trainer_state["checkpoint_id"]):
            raise CheckpointError(
                f"{weights_path} and {state_path} belong to different saves and the other half of the last save "
                "is gone; the step_*.safetensors files hold weights only: start a new run from them with "
                "--init-from, or from scratch")
        return load_checkpoint(run_dir, name, model, optimizer, restore_rng, strict)
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


def _state_id(path: Path) -> str | None:
    try:
        return torch.load(path, map_location="cpu", weights_only=True).get("checkpoint_id")
    except Exception:  # a temporary file cut short: not the one that finishes the save
        return None


def _weights_id(path: Path) -> str | None:
    try:
        return read_weights(path)[1].get(_ID_KEY)
    except CheckpointError:
        return None


def _finish_interrupted_save(weights_path: Path, state_path: Path, weights_id: str | None,
                             state_id: str | None) -> bool:
    """Rename into place the complete temporary file that a save killed between its two renames left.

    The weights are renamed first, so the usual case is new weights and the new state still in its
    temporary file (at the first save, no state file at all); the reverse is handled alike. Only a
    temporary file whose id is the other file's is taken. True if the pair is whole again.
    """
    for target, temps, wanted, read_id in ((state_path, left_behind(state_path), weights_id, _state_id),
                                           (weights_path, left_behind(weights_path), state_id, _weights_id)):
        for tmp in temps:
            if wanted is not None and read_id(tmp) == wanted:
                os.replace(tmp, target)
                warnings.warn(f"{target}: the last save was interrupted between its two files; finished it from "
                              f"{tmp.name}", stacklevel=3)
                return True
    return False


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
