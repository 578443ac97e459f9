"""Restoring a backup into a data directory, offline (`effectd ctl restore`).

No daemon may serve the data directory meanwhile: the restore holds the
daemon's own lock on it (`effectd.lock`) from start to end, so it refuses
while a daemon runs there, and a daemon started meanwhile refuses to start.
It refuses, too, a data directory that already holds a store (restoring over
it would throw away what it holds: move it aside first), a backup that is not
an effectd store of a format this daemon reads, a backup a running daemon is
serving from, and a data directory inside the backup.

The copy is staged in `DIR/restore-staging/`, where no daemon looks: the
backup is copied there (compacted), opened as a store, which checks its
format, and marked (`ledger.restore`): every call not COMMITTED turned
UNKNOWN in bounded batches, then the checkpoint revision counter moved
ahead, the marker and the audit entry, each transaction synced. Only then is
its data file renamed into DIR, atomically, and DIR synced: nothing can be
answered from the restored data before it is marked. A restore that stops
half way leaves DIR without a store and with the staging directory, which a
daemon refuses to start on (`refuse_unfinished`); running the restore again
starts over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import lmdb

from sidecar.clock import Clock
from sidecar.ledger.restore import Marker
from sidecar.locking import AlreadyLocked, ExclusiveLock
from sidecar.storage.api import Table
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore, StoreFormatError
from sidecar.storage.marking import RestoreRefused, UnfinishedRestore, mark

STAGING = "restore-staging"
DATA_FILE = "data.mdb"


@dataclass(frozen=True, slots=True)
class Restored:
    marker: Marker
    data_dir: Path
    # Size of the restored data file.
    bytes: int


def refuse_unfinished(data_dir: Path) -> None:
    """Raises UnfinishedRestore if a restore into `data_dir` did not finish."""
    if (data_dir / STAGING).exists() and not (data_dir / DATA_FILE).exists():
        raise UnfinishedRestore(
            f"a restore into {data_dir} did not finish (it holds {STAGING}/ and "
            "no store): run `effectd ctl restore` again"
        )


def restore_backup(
    backup: Path,
    data_dir: Path,
    *,
    actor: str,
    reason: str,
    clock: Clock,
    map_size: int | None = None,
) -> Restored:
    """Restores `backup` into `data_dir` and marks it restored; see the module
    docstring for the refusals (RestoreRefused) and the order of the steps."""
    backup, data_dir = backup.absolute(), data_dir.absolute()
    _check_backup(backup)
    _check_data_dir(backup, data_dir)
    data_dir.mkdir(mode=0o700, exist_ok=True)
    try:
        lock = ExclusiveLock(data_dir / "effectd.lock", f"data directory {data_dir}")
    except AlreadyLocked as exc:
        raise RestoreRefused(f"{exc}: stop that daemon first") from None
    try:
        if (data_dir / DATA_FILE).exists():
            raise RestoreRefused(
                f"{data_dir} already holds a store: move it aside (or restore into "
                "a new directory); restoring over it would lose what it holds"
            )
        staging = data_dir / STAGING
        if staging.exists():
            shutil.rmtree(staging)  # left by a restore that stopped half way
        staging.mkdir(mode=0o700)
        _copy(backup, staging)
        options = LmdbOptions(sync=True)
        if map_size is not None:
            options = dataclasses.replace(options, map_size=map_size)
        try:
            marker = _mark(
                staging,
                backup,
                actor=actor,
                reason=reason,
                clock=clock,
                options=options,
            )
            size = _install(staging, data_dir)
        except RestoreRefused:
            raise
        except Exception as exc:
            left = (
                "the marked copy is in place"
                if (data_dir / DATA_FILE).exists()
                else f"{data_dir} holds no store; run the restore again"
            )
            raise RestoreRefused(
                f"the restore stopped ({type(exc).__name__}: {exc}); {left}"
            ) from exc
        _discard(staging)
    finally:
        lock.release()
    return Restored(marker, data_dir, size)


def _check_backup(backup: Path) -> None:
    if not (backup / DATA_FILE).is_file():
        raise RestoreRefused(f"{backup} is not a backup: it has no {DATA_FILE}")
    lock_file = backup / "effectd.lock"
    if not lock_file.exists():
        return
    # Read-only: checking must not change the backup.
    fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RestoreRefused(
            f"{backup} is the data directory of a running daemon: take a "
            "consistent copy with `effectd ctl backup`, and restore that"
        ) from None
    finally:
        os.close(fd)


def _check_data_dir(backup: Path, data_dir: Path) -> None:
    real_backup, real_dir = backup.resolve(), data_dir.resolve()
    if real_dir == real_backup or real_backup in real_dir.parents:
        raise RestoreRefused(
            f"{data_dir} is (inside) the backup: restore into another directory, "
            "and keep the backup as it is"
        )
    if not data_dir.parent.is_dir():
        raise RestoreRefused(f"the parent of {data_dir} does not exist")
    if data_dir.exists():
        if not data_dir.is_dir():
            raise RestoreRefused(f"{data_dir} exists and is not a directory")
        if data_dir.stat().st_mode & 0o022:
            raise RestoreRefused(
                f"{data_dir} is group- or world-writable; chmod 700 it"
            )


def _copy(backup: Path, staging: Path) -> None:
    try:
        env = lmdb.open(
            str(backup), readonly=True, lock=False, subdir=True, max_dbs=len(Table)
        )
    except lmdb.Error as exc:
        raise RestoreRefused(f"{backup} cannot be read as a store: {exc}") from None
    try:
        env.copy(str(staging), compact=True)
    except lmdb.Error as exc:
        raise RestoreRefused(f"{backup} cannot be copied: {exc}") from None
    finally:
        env.close()
    os.chmod(staging / DATA_FILE, 0o600)


def _mark(
    staging: Path,
    backup: Path,
    *,
    actor: str,
    reason: str,
    clock: Clock,
    options: LmdbOptions,
) -> Marker:
    try:
        store = LmdbStore(staging, options)
    except StoreFormatError as exc:
        raise RestoreRefused(f"{backup}: {exc}") from None
    try:
        return mark(store, str(backup), actor=actor, reason=reason, clock=clock)
    finally:
        store.close()


def _install(staging: Path, data_dir: Path) -> int:
    """Moves the marked data file into `data_dir`, durably."""
    data = staging / DATA_FILE
    _fsync(data)
    with contextlib.suppress(FileNotFoundError):
        # Reader slots of an earlier store; nobody holds it (we hold the lock).
        os.unlink(data_dir / "lock.mdb")
    os.replace(data, data_dir / DATA_FILE)
    _fsync(data_dir)
    return (data_dir / DATA_FILE).stat().st_size


def _discard(staging: Path) -> None:
    # What is left there (LMDB's lock file) is nobody's now.
    shutil.rmtree(staging)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
