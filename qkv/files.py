"""Files, written whole or not at all, and read strictly.

- Atomic writes: a file is written to a temporary name beside it, flushed, and renamed over the old
  one (``os.replace``, atomic on POSIX and Windows), so a kill at any moment leaves the old file or
  the new one, never half of one. :func:`atomic_paths` does it for several files at once: none is
  renamed until all are complete; :func:`left_behind_in` finds what killed writers left.
- File modes: a file written whole through a temporary one gets the mode a plain ``open()`` would have
  given it (0644 under umask 022), or, replacing a file, that file's mode (as git and rsync keep it):
  :func:`match_mode`, which every such writer goes through (:func:`atomic_paths`; the staged folders of
  ``qkv.interop.export``). A temporary file's own mode is private (safetensors writes 0600).
- Strict text reading: UTF-8 or an error that names the file, line and column; lines end at ``\\n``.
- :func:`user_cache`: qkv's folder in the user's cache (kernel choices, compiled steps, fonts).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

from qkv.errors import DataError


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


def umask() -> int:
    """The process's umask, left as it is."""
    try:  # Linux says it without changing it
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    # Elsewhere os.umask only reads it by setting another: 022 for that instant, so that a file another
    # thread creates then is no more open than a usual umask makes it.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def creation_mode(directory: bool = False) -> int:
    """The mode ``open()`` gives a new file (``os.mkdir`` a new folder) under the umask: 0o644 (0o755) under 022."""
    return (0o777 if directory else 0o666) & ~umask()


def match_mode(written: Path, target: Path) -> None:
    """Give ``written``, about to replace ``target``, the mode ``target`` has, or the mode a new file (or
    folder) would get if there is none: a temporary file's own mode (0600 from safetensors, 0700 from
    ``mkdtemp``) is never what a user sees."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = creation_mode(directory=written.is_dir())
    os.chmod(written, mode)


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
    are deleted. Each file gets its target's mode, or a new file's (:func:`match_mode`).

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
            match_mode(tmp, path)
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


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path``, atomically."""
    path = Path(path)
    with atomic_path(path) as tmp, as_os_error(path):
        tmp.write_bytes(data)
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


__all__ = ["umask", "creation_mode", "match_mode", "left_behind", "left_behind_in", "atomic_paths", "as_os_error", "atomic_path", "write_text", "write_json", "decode_utf8", "valid_text", "read_text_file", "read_lines", "read_json", "user_cache"]
