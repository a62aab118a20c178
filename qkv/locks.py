"""Exclusive locks on files that the system releases however their process ends.

A lock is an exclusive ``flock`` on a file: a process killed by any signal, or the machine's power,
lets go of it with no stale file to clear, and a process id that another process has taken since
cannot be mistaken for the holder. The file holds, for people to read, who holds the lock; the lock,
not the file, decides. Used by the run directory's one writer (``qkv.runs``) and by the Table 3 grid's
claims on its variants (``qkv.experiments.grid``).

Without POSIX locks (Windows) every lock is granted: nothing is refused, as before there were locks.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

LOCKS = fcntl is not None  # whether locks can refuse anyone here


def try_lock(path: str | Path) -> int | None:
    """Open ``path`` (created if missing) and lock it: its file descriptor, or None if another holds it.

    The lock lasts until the descriptor is closed (:func:`release`) or the process ends.
    """
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)  # the umask decides, as for any file
        if fcntl is None:
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process holds it
            os.close(fd)
            return None
        # The holder before may have removed the file as it let go (:func:`put_back`): a lock on a file that is
        # no longer at ``path`` locks nothing, so take the one there now.
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def describe(fd: int, text: str) -> None:
    """Write ``text`` (who holds the lock) into the locked file."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode("utf-8"), 0)


def put_back(fd: int, path: str | Path, found: bytes | None) -> None:
    """Leave the locked file as it was found before :func:`try_lock`: its bytes (``found``), or no file (None)."""
    if found is None:
        os.unlink(path)
    else:
        os.ftruncate(fd, 0)
        os.pwrite(fd, found, 0)


def holder(path: str | Path) -> str:
    """What the holder of the lock on ``path`` wrote there (empty if it has not yet)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def release(fd: int) -> None:
    """Let go of the lock: close its descriptor."""
    os.close(fd)


__all__ = ["LOCKS", "try_lock", "describe", "put_back", "holder", "release"]
