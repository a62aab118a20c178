"""The machine, its devices and their precision, for every part of qkv.

- Devices and precision: ``auto`` means CUDA when torch sees one, else the CPU; asking for a device
  that is absent is an error that says so (never a traceback from deep inside torch). bf16 autocast
  on CUDA, fp32 on CPUs (most have no bf16 units: it runs many times slower there).
- The machine: :func:`cpu_identity` names the CPU a measurement was made on (kernel choices, results);
  :func:`keep_freed_memory` has the C allocator reuse a training step's large tensors.
- :func:`evaluating`: eval mode and no gradients for a block, the model's mode put back after.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import platform
import sys
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from qkv.errors import DeviceError, did_you_mean


# ----------------------------------------------------------------------------------------------
# The machine


@functools.cache  # the files do not change while a process runs
def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo"),
                 caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> str:
    """The CPU's name and what tells apart the CPUs one name can cover: family, model and stepping, and the
    sizes of its L2 and L3 caches (Linux's files; elsewhere the name alone).

    A virtual machine may report a generic name ("Intel(R) Xeon(R) Processor", as the development
    machines of this project do), which covers CPUs whose fastest kernels differ: the same products
    stream from a 480 MB L3 on one and from memory on another.
    """
    name, ids = platform.processor() or platform.machine(), []
    try:
        with open(cpuinfo, encoding="utf-8") as f:  # the first processor's block
            fields = dict(line.split(":", 1) for line in itertools.takewhile(str.strip, f) if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        name = fields.get("model name", name)
        ids = [f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields]
    except OSError:
        pass
    sizes: dict[str, str] = {}  # cache level -> size
    try:
        for index in sorted(caches.glob("index*")):
            sizes[index.joinpath("level").read_text().strip()] = index.joinpath("size").read_text().strip()
    except OSError:
        pass
    ids += [f"L{level} {sizes[level]}" for level in ("2", "3") if level in sizes]
    return f"{name} ({', '.join(ids)})" if ids else name


# glibc's malloc settings of keep_freed_memory: blocks up to 1 GiB from its heap (not mapped one by one),
# and freed memory kept there (2 GiB - 1, the most mallopt takes) rather than handed back to the kernel.
MALLOC_MMAP_THRESHOLD = 1 << 30
MALLOC_TRIM_THRESHOLD = 2**31 - 1
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def keep_freed_memory() -> bool:
    """Have the C allocator keep the memory of freed tensors for the next ones (Linux with glibc).

    PyTorch allocates CPU tensors with the C library's ``malloc``. glibc maps every block above its
    mmap threshold (which grows to 32 MB at most) straight from the kernel and hands it back when it is
    freed, so a training step that allocates the same large tensors at every step, such as the
    (tokens x vocabulary) scores of the loss (70 MB for a Multi30K batch), pays each time for fresh
    pages that the kernel must fault in and zero. Keeping those blocks in the heap is what preloading
    jemalloc or tcmalloc does, as PyTorch's CPU performance guide advises; this gets it from glibc
    itself, with no library to install: a Table 3 training step takes 7% less time (docs/BENCHMARKS.md,
    "The allocator"). The price: a process's resident memory stays near its peak rather than shrinking
    between steps, which a training process reaches at every step anyway. Every trainer's ``start``
    calls it, and so does ``qkv eval lm``; decoding does not (its tensors are small: no gain measured).

    Returns:
        Whether the settings took: False on other systems and C libraries, where nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Both or neither: a trim threshold alone turns off the growing mmap threshold and maps more.
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


# ----------------------------------------------------------------------------------------------
# Devices and precision

# Every command's --device and every recipe's train.device default to this.
DEVICE_DEFAULT = "auto"
DTYPES = ("auto", "fp32", "bf16", "fp16")


def resolve_device(name: str | torch.device | None = DEVICE_DEFAULT) -> torch.device:
    """``auto`` (or None): CUDA when torch sees one, else the CPU; an absent device is a :class:`DeviceError`.

    Args:
        name: ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``, or a ``torch.device``.
    """
    if name is None or str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"unknown device {str(name)!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {str(name)!r} was asked for, but torch sees no CUDA device here; "
                              "use --device cpu (or auto)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {str(name)!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device {str(name)!r} was asked for, but MPS is not available here; use --device cpu")
    return device


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``dtype`` on ``device`` (None: fp32).

    ``auto``: bf16 on a GPU that has it, fp16 (with a gradient scaler in training) on one that does
    not, fp32 on CPUs, where fp16 runs many times slower, and bf16 too on CPUs without bf16 instructions
    (docs/BENCHMARKS.md, "The figures behind the decoding rules").
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}{did_you_mean(dtype, DTYPES)}")
    if dtype in ("bf16", "fp16") and device.type != "cuda":
        raise ValueError(f"dtype {dtype!r} is for CUDA only: qkv trains and decodes in fp32 on a CPU (fp16 runs "
                         "many times slower there, and bf16 does on CPUs without bf16 instructions); use fp32")
    if device.type != "cuda" or dtype == "fp32":
        return None
    has_bf16 = torch.cuda.is_bf16_supported()
    if dtype == "bf16" and not has_bf16:
        raise ValueError(f"{torch.cuda.get_device_name(device)} has no bf16: use dtype fp16 (or auto)")
    return torch.bfloat16 if dtype == "bf16" or (dtype == "auto" and has_bf16) else torch.float16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``, or nothing for fp32 (None)."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; a CPU batch bound for a GPU goes through pinned memory without blocking."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (all of a qkv model's parameters share one)."""
    return next(model.parameters()).device


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode (no dropout) and no gradients inside the block; the model's train/eval mode after is as before."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


__all__ = ["cpu_identity", "MALLOC_MMAP_THRESHOLD", "MALLOC_TRIM_THRESHOLD", "keep_freed_memory", "DEVICE_DEFAULT", "DTYPES", "resolve_device", "autocast_dtype", "autocast", "to_device", "model_device", "evaluating"]
