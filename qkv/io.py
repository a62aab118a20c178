"""What every part of qkv needs from the outside world, written once: files, names, devices, precision.

- Atomic writes: a file is written to a temporary name beside it, flushed, and renamed over the old
  one (``os.replace``, atomic on POSIX and Windows), so a kill at any moment leaves the old file or
  the new one, never half of one. :func:`atomic_paths` does it for several files at once: none is
  renamed until all are complete.
- Strict text reading: UTF-8 or an error that names the file, line and column; lines end at ``\\n``.
- "Did you mean": one spelling of the hint that follows an unknown name.
- Devices and precision: ``auto`` means CUDA when torch sees one, else the CPU; asking for a device
  that is absent is an error that says so (never a traceback from deep inside torch). bf16 autocast
  on CUDA, fp32 on CPUs (most have no bf16 units: it runs 6-100x slower there).
- The machine: :func:`cpu_identity` names the CPU a measurement was made on (kernel choices, results);
  :func:`keep_freed_memory` has the C allocator reuse a training step's large tensors.
- :func:`evaluating`: eval mode and no gradients for a block, the model's mode put back after.
"""

from __future__ import annotations

import contextlib
import ctypes
import difflib
import functools
import importlib
import itertools
import json
import os
import platform
import re
import sys
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch
from torch import nn

# ----------------------------------------------------------------------------------------------
# Errors


class QkvError(Exception):
    """Every error qkv raises on purpose: its message names the problem (file, line, key) and what to do.

    Each kind is also the built-in error of its nature, so ``except ValueError`` still catches bad input:
    ``ValueError`` kinds (config, data, run, device, tokenizer) are the user's input; the others
    (checkpoints, non-finite training, ranks) are failures while running.
    """


class DataError(QkvError, ValueError):
    """Input that cannot be read: a missing or malformed file, a corpus unlike its registry entry.

    The message names the file (and line where there is one) and what to do.
    """


class DeviceError(QkvError, ValueError):
    """A device that was asked for but is not there (``cuda`` on a machine without CUDA)."""


class MissingDependencyError(QkvError, ImportError):
    """An optional library that one command needs is not installed; the message names the extra."""


def require(module: str, extra: str, purpose: str, package: str | None = None) -> Any:
    """Import the optional library ``module`` for ``purpose``, or say which qkv extra installs it.

    Example: ``require("transformers", "hf", "qkv export hf")`` -> the module, or the error
    "qkv export hf needs transformers, an optional part of qkv: pip install 'qkv[hf]'". ``package``
    names what is missing when it is not the module's first part (torch.utils.tensorboard needs
    tensorboard).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{purpose} needs {package or module.split('.')[0]}, an optional part of "
                                     f"qkv: pip install 'qkv[{extra}]'") from None


def did_you_mean(key: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` when a choice is close to ``key``, else ``""``: the tail of an error message."""
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


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


def left_behind(path: Path) -> list[Path]:
    """The temporary files of ``path`` that processes killed mid-write left (their writer is gone).

    A kill after a temporary file was complete but before its rename leaves the whole new file there:
    a reader can finish the write (see ``training.checkpoint``).
    """
    return [p for p in path.parent.glob(f".{path.name}.tmp-*")
            if (m := _TEMP.match(p.name)) and m["name"] == path.name and _gone(int(m["pid"]))]


def left_behind_in(directory: Path, keep: Sequence[str] = ()) -> list[Path]:
    """Every temporary file in ``directory`` whose writer is gone, but those of the files named in
    ``keep``: this module's (``.NAME.tmp-PID-*``) and those safetensors writes before its own rename
    (``.tmpXXXXXX``), which name no writer: only a caller that holds the directory's one-writer lock may
    take those for abandoned."""
    return sorted(p for p in directory.iterdir()
                  if ((m := _TEMP.match(p.name)) and m["name"] not in keep and _gone(int(m["pid"])))
                  or _SAFETENSORS_TEMP.match(p.name))


_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+$")  # atomic_paths' temporary files
_SAFETENSORS_TEMP = re.compile(r"^\.tmp[A-Za-z0-9_]{6}$")


def _gone(pid: int) -> bool:
    """Whether the process ``pid`` (a temporary file's writer) has ended."""
    if os.name != "posix" or pid == os.getpid():  # os.kill(pid, 0) is a liveness probe only on POSIX
        return False
    try:
        os.kill(pid, 0)  # still running: maybe another process writing; leave it
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError included: someone else's live process
        pass
    return False


def _remove_stale_temps(path: Path) -> None:
    """Delete temporary files left for ``path`` by processes that were killed mid-write."""
    for other in left_behind(path):
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
                raise OSError(f"{path}: the writer did not create the temporary file {tmp}")
            _fsync_file(tmp)  # data on disk before the rename makes it visible
        for path, tmp in zip(targets, temps):
            os.replace(tmp, path)
    except BaseException as e:  # also KeyboardInterrupt: never leave a temporary file behind
        for tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()
        named = isinstance(e, OSError) and e.errno is not None and str(e.filename) in map(str, temps)
        if named:  # a full disk or a read-only folder: name the file being written, not its temporary
            target = targets[[str(t) for t in temps].index(str(e.filename))]
            raise OSError(e.errno, e.strerror, str(target)) from e
        raise
    for parent in {p.parent for p in targets}:
        _fsync_dir(parent)


@contextlib.contextmanager
def as_os_error(path: str | Path) -> Iterator[None]:
    """Let a library's failed write be the OSError it hides, naming ``path``.

    safetensors reports a full disk as ``SafetensorError: ... I/O error: No space left on device (os error
    28)``, and an OSError from a plain file without its name; either becomes ``OSError(errno, strerror,
    path)``, which :func:`atomic_paths` and the CLI turn into one line naming the file.
    """
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except Exception as e:  # noqa: BLE001 - re-raised unless it carries an OS error code
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        errno = int(code.group(1))
        raise OSError(errno, os.strerror(errno), str(path)) from e


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """:func:`atomic_paths` for one file: yield a temporary path, moved over ``path`` on success."""
    with atomic_paths(path) as (tmp,):
        yield tmp


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path``, atomically."""
    path = Path(path)
    with atomic_path(path) as tmp, as_os_error(path):  # a full disk names the file, not only "No space left"
        tmp.write_text(text, encoding="utf-8")
    return path


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON (non-ASCII kept readable) to ``path``, atomically."""
    return write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------------
# Strict text reading


def decode_utf8(data: bytes, path: str | Path) -> str:
    """Decode ``data`` as UTF-8; a bad byte is an error naming the file, line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        line_start = data.rfind(b"\n", 0, e.start) + 1
        raise DataError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[e.start]:02x} at column {e.start - line_start + 1}, "
            f"byte offset {e.start}: {e.reason})"
        ) from None


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate (a half of a UTF-16 pair, which JSON escapes and
    ``surrogateescape`` can produce but UTF-8 cannot hold) replaced by U+FFFD; other text unchanged."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def read_text_file(path: str | Path) -> str:
    """The whole file as UTF-8 text (errors name the file and line of the first bad byte)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    return decode_utf8(path.read_bytes(), path)


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without their line endings.

    Only ``\\n`` (and a ``\\r`` before it) ends a line: ``str.splitlines`` would also split on characters
    such as U+2028 or U+0085 that can occur inside a sentence, and shift every later line of a
    parallel corpus out of alignment.
    """
    text = read_text_file(path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start an empty one
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """The JSON in ``path``; a missing or malformed file is a :class:`DataError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such {what}")
    try:
        return json.loads(read_text_file(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); the {what} is damaged") from None


def user_cache(*parts: str) -> Path:
    """A path in qkv's user cache: ``$XDG_CACHE_HOME/qkv/...``, by default ``~/.cache/qkv/...``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "qkv", *parts)


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
    not, fp32 on CPUs, where half precision is 6-100x slower.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}{did_you_mean(dtype, DTYPES)}")
    if dtype in ("bf16", "fp16") and device.type != "cuda":
        raise ValueError(f"dtype {dtype!r} is for CUDA only: CPUs without half-precision units run it 6-100x "
                         "slower; use fp32")
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


__all__ = [
    "QkvError", "DataError", "DeviceError", "did_you_mean", "atomic_paths", "atomic_path", "left_behind", "left_behind_in", "write_text", "write_json",
    "decode_utf8", "valid_text", "read_text_file", "read_lines", "read_json", "user_cache", "cpu_identity",
    "DEVICE_DEFAULT", "DTYPES", "resolve_device", "autocast_dtype", "autocast", "to_device", "model_device", "evaluating",
]
