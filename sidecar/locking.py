"""Exclusive, advisory process locks (flock) on a lock file.

A second daemon on the same data directory or socket must fail loudly:
gRPC would otherwise unlink and take over a live Unix socket, and two
processes would both write the LMDB environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class AlreadyLocked(RuntimeError):
    """Another process holds the lock."""


class ExclusiveLock:
    """Holds `flock(LOCK_EX)` on `path` until `release`; the file keeps the pid."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyLocked(
                f"{what} is in use by another effectd (pid {holder}, lock {path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        # The file stays: unlinking a lock file lets a third process lock a
        # new inode while a second still waits on the old one.
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
