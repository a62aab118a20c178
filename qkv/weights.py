"""Weights files: safetensors, tied parameters stored once and tied again on load, averages of several.

A safetensors file holds tensors and a string header, nothing that runs code when it is read.
``safetensors.torch.save_file`` refuses tensors that share memory, so a tied embedding / output
projection (Section 3.4) is saved with ``save_model``, which stores it once; :func:`load_state_dict_into`
accepts either name for a tied group. Loading checks every name and shape and lists all that differ,
since a file of another model is never what was meant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_model
from torch import nn

from qkv.errors import QkvError
from qkv.files import as_os_error, atomic_path

WEIGHTS_SUFFIX = ".safetensors"


class CheckpointError(QkvError, RuntimeError):
    """Weights or a checkpoint that cannot be written or loaded: missing, mismatched or inconsistent files."""


class NonFiniteWeights(CheckpointError):
    """Weights that hold NaN or infinite values: never used (a damaged disk, or another tool wrote them)."""


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


def _short(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return f"{len(names)} ({shown}{f', ... {len(names) - limit} more' if len(names) > limit else ''})"


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
        NonFiniteWeights: Naming a tensor that holds NaN or infinite values (nothing is copied in).
    """
    for name, tensor in state_dict.items():  # weights a damaged disk or another tool wrote are not used
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise NonFiniteWeights(f"{source}: tensor {name} holds NaN or infinite values, so these weights cannot "
                                  "be used: choose others with --weights (best, last, average), or resume the run "
                                  "from its last checkpoint")
    model = unwrap_model(model)
    upgrade = getattr(model, "upgrade_state_dict", None)
    if upgrade is not None:  # the names of an earlier qkv, as this model's parameters have them today
        state_dict = upgrade(state_dict)
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
        # One line (the CLI prints errors as one), the counts first: a few names say which part differs.
        parts = []
        if missing:
            parts.append(f"missing keys (in the model, not in the file): {_short(missing)}")
        if unexpected:
            parts.append(f"unexpected keys (in the file, not in the model): {_short(unexpected)}")
        if mismatched:
            parts.append(f"shape mismatches: {_short(mismatched)}")
        raise CheckpointError(f"{source}: cannot load into {type(model).__name__}: {'; '.join(parts)}")
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
    path = Path(path)
    with atomic_path(path) as tmp:
        write_weights(model, tmp, metadata)
    return path


def write_weights(model: nn.Module, path: str | Path, metadata: Mapping[str, str] | None = None) -> None:
    """The model's weights into ``path`` as safetensors (tied tensors once), not atomically: the writer of
    :func:`save_weights` and of checkpoints, which give it a temporary file. A full disk is an OSError
    naming ``path``."""
    with as_os_error(path):
        save_model(unwrap_model(model), str(path), metadata=dict(metadata) if metadata else None)


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
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
    tensors, _ = read_weights(path)
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
    first, _ = read_weights(first_path)
    sums = {k: v.double() if v.is_floating_point() else v for k, v in first.items()}
    for p in paths[1:]:
        p = Path(p)
        tensors, _ = read_weights(p)
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


__all__ = ["WEIGHTS_SUFFIX", "CheckpointError", "NonFiniteWeights", "unwrap_model", "load_state_dict_into", "save_weights",
           "read_weights", "load_weights", "average_checkpoints"]
