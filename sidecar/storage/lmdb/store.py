"""The LMDB store: group commit, durable by default.

A write function submitted from a thread (`submit`) is queued to one writer
thread; the writer drains what is queued into one transaction, commits it
once (one fsync for many requests), and only then answers them
(`storage.lmdb.answers`): no answer leaves before its data is durable. A write
awaited on the event loop (`write`) is committed on the loop itself: the
writes of one pass of the loop are gathered and committed together, once,
at the start of its next pass (group commit across every message of the
pass), which spares each write two thread hand-offs (to the writer and back)
and the interpreter lock the two threads would share; if the writer thread
holds the transaction then, they go to its queue instead. One transaction
at a time either way (`_txn`), begun and committed on one thread, as LMDB
wants. Reads use their own read-only transactions on the caller's thread
and never wait for a writer (MVCC); a read sees a commit only once it is
durable (LMDB shows it to readers after its synced meta page).

Over 400 lines on purpose: both ways of writing share one commit, with its
handling of a request LMDB refuses and of a batch too big for the map.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import lmdb

from sidecar.errors import (
    BackupTargetError,
    ShuttingDown,
    StorageFull,
    StorageUnavailable,
)
from sidecar.failpoints import Failpoints, Point
from sidecar.ledger.quota import StoreFill
from sidecar.locking import ExclusiveLock
from sidecar.storage import calls, counting, usage
from sidecar.storage.api import (
    CallWrite,
    FormatError,
    ReadView,
    Table,
    WriteView,
)
from sidecar.storage.keys import MAX_KEY_BYTES
from sidecar.storage.lmdb import answers, migration
from sidecar.storage.lmdb.views import BufferedView, TxnView
from sidecar.storage.plan_rows import Summarize

T = TypeVar("T")
log = logging.getLogger(__name__)

# 2: per-namespace usage counters (Table.USAGE), kept by every write. A
# daemon that reads only format 1 would write without updating them, so it
# must not open a format 2 store.
# 3: long identity parts stored hashed (`storage.keys`), fingerprints that
# name their kind, tombstones indexed by time and counted apart. A daemon of
# format 2 would look long identities up where they no longer are.
# 4: the retention index (`storage.retention_times`); 5: the plan rows
# (`storage.plan_rows`). A daemon of the format before would leave them stale
# (a row would answer for an older record): it must not open the store.
# Formats 1 to 4 are upgraded at open (`storage.lmdb.migration`);
# `storage.daemons` changes no format.
FORMAT_VERSION = b"5"
_UPGRADABLE = frozenset({b"1", b"2", b"3", b"4"})
_FORMAT_KEY = b"format_version"
_INCARNATION_KEY = b"incarnation"
# LMDB's two meta pages, at the start of the data file.
_META_PAGES = 2
# How LMDB reports a full filesystem: ENOSPC, EDQUOT, EFBIG (RLIMIT_FSIZE);
# a write cut short by a full disk is EIO, taken as full below this much
# free space.
_FULL_DISK = ("No space left on device", "Disk quota exceeded", "File too large")
_NEARLY_FULL = 16 << 20


class StoreFormatError(FormatError):
    """The data directory holds a store of another format version."""


@dataclass(frozen=True, slots=True)
class LmdbOptions:
    """How the environment is opened. The defaults are the durable ones."""

    # Virtual address space, not disk: the file grows as data is written.
    map_size: int = 8 << 30
    # fsync data and meta pages on every commit (survives power loss).
    sync: bool = True
    max_readers: int = 1024
    max_batch: int = 256
    # Called by the writer thread after each durable commit with the batch
    # size and the seconds the commit took (fsync included); must be cheap.
    on_commit: Callable[[int, float], None] | None = None
    # A test build's crash points in the write path (`sidecar.failpoints`).
    failpoints: Failpoints | None = None
    # Makes the plan rows (`storage.plan_rows`); None: no rows are written.
    summarize: Summarize | None = None


@dataclass(slots=True)
class WriterStats:
    """What the writer has done; read by tests and metrics."""

    transactions: int = 0
    writes: int = 0
    largest_batch: int = 0


_Item = tuple[Callable[[WriteView], Any], answers.Waiter]
_STOP = object()


class LmdbStore:
    """`api.Store` on an LMDB environment in `path` (created 0700, files 0600)."""

    exclusive = True  # one daemon at a time: the data directory's lock
    reads_wait = False  # memory-mapped pages: read inline on the loop
    saves_by_statement = False

    def __init__(self, path: Path, options: LmdbOptions | None = None) -> None:
        self.options = options or LmdbOptions()
        self.path = path
        self.stats = WriterStats()
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        self._lock = ExclusiveLock(path / "effectd.lock", f"data directory {path}")
        try:
            self._env = self._open(path)
        except BaseException:
            self._lock.release()
            raise
        self._queue: queue.SimpleQueue[_Item | object] = queue.SimpleQueue()
        # Held by whoever has a write transaction open: the writer thread or
        # the event loop.
        self._txn = threading.Lock()
        # The writes awaited on each loop, gathered until its next pass (a
        # loop commits its own, on its own thread).
        self._gathered: dict[asyncio.AbstractEventLoop, list[_Item]] = {}
        self._closing = threading.Lock()
        self._closed = False
        self._writer = threading.Thread(
            target=self._run, name="effectd-writer", daemon=True
        )
        self._writer.start()
        try:
            self._incarnation = self.submit(_open_incarnation).result()
            migration.resume(self, self.options.summarize)
            # A store written before the usage counters existed, or before
            # they counted tombstones apart, is counted now.
            counted = self.submit(usage.ensure_counted).result()
            if counted:
                log.info("usage counters of %d namespaces counted", counted)
        except BaseException:
            self.close()
            raise

    def _open(self, path: Path) -> lmdb.Environment:
        o = self.options
        env = lmdb.open(
            str(path),
            map_size=o.map_size,
            subdir=True,
            max_dbs=len(Table),
            max_readers=o.max_readers,
            sync=o.sync,
            metasync=o.sync,
            writemap=False,
            map_async=False,
            lock=True,
            mode=0o600,
            max_spare_txns=0,
        )
        if env.max_key_size() < MAX_KEY_BYTES:
            env.close()
            raise StoreFormatError(
                f"this LMDB stores keys of at most {env.max_key_size()} bytes, "
                f"effectd needs {MAX_KEY_BYTES}"
            )
        stale = env.reader_check()
        if stale:
            log.warning("cleared %d stale LMDB reader slots", stale)
        for name in ("data.mdb", "lock.mdb"):
            os.chmod(path / name, 0o600)
        self._dbs = {t: env.open_db(t.value.encode()) for t in Table}
        return env

    @property
    def incarnation(self) -> int:
        return self._incarnation

    def read(self, fn: Callable[[ReadView], T]) -> T:
        if self._closed:
            raise ShuttingDown("the store is closed")
        with self._env.begin(write=False) as txn:
            return fn(TxnView(txn, self._dbs))

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._closing:
            if self._closed:
                future.set_exception(ShuttingDown("the store is closed"))
            else:
                self._queue.put((self._counted(fn), future))
        return future

    def _counted(self, fn: Callable[[WriteView], T]) -> Callable[[WriteView], T]:
        counted = counting.counted(fn)
        failpoints = self.options.failpoints
        return counted if failpoints is None else failpoints.tag(counted)

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        loop = asyncio.get_running_loop()
        waiter = answers.LoopWaiter(loop)
        if self._closed:
            raise ShuttingDown("the store is closed")
        gathered = self._gathered.get(loop)
        if gathered is None:
            gathered = self._gathered[loop] = []
            loop.call_soon(self._commit_gathered, loop)
        gathered.append((self._counted(fn), waiter))
        value: T = await waiter.future
        return value

    async def save_call(self, write: CallWrite) -> None:
        """The compare-and-swap of one record (`storage.calls`), as a write
        of its own."""
        await self.write(functools.partial(calls.compare_and_save, write=write))

    def _commit_gathered(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: commits the writes of its last pass, or hands them to
        the writer thread when it holds the transaction."""
        batch = self._gathered.pop(loop, [])
        if not self._txn.acquire(blocking=False):
            with self._closing:
                if not self._closed:  # else the writer has stopped
                    for item in batch:
                        self._queue.put(item)
                    return
            error = ShuttingDown("the store is closed")
            answers.resolve([(w, None, error) for _, w in batch])
            return
        try:
            if self._closed:
                error = ShuttingDown("the store is closed")
                answers.resolve([(w, None, error) for _, w in batch])
                return
            for start in range(0, len(batch), self.options.max_batch):
                part = batch[start : start + self.options.max_batch]
                live = [(fn, w) for fn, w in part if answers.claim(w)]
                if live:
                    self._commit(live)
        finally:
            self._txn.release()

    def close(self) -> None:
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._writer.join()
        with self._txn:  # a commit on the loop finishes first
            self._env.close()
        self._lock.release()

    def entries(self, table: Table) -> int:
        """How many keys `table` holds, from its B-tree header: O(1)."""
        if self._closed:
            raise ShuttingDown("the store is closed")
        with self._env.begin(write=False) as txn:
            return int(txn.stat(self._dbs[table])["entries"])

    def fill(self) -> StoreFill:
        """Bytes in use against the map size, from the B-tree headers: O(tables)."""
        if self._closed:
            raise ShuttingDown("the store is closed")
        with self._env.begin(write=False) as txn:
            stats = [txn.stat(db) for db in self._dbs.values()]
        stats.append(self._env.stat())  # the main tree, which names the tables
        page = stats[-1]["psize"]
        pages = _META_PAGES + sum(
            s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"] for s in stats
        )
        info = self._env.info()
        return StoreFill(
            used_bytes=pages * page,
            high_water_bytes=(info["last_pgno"] + 1) * page,
            map_size_bytes=info["map_size"],
        )

    def backup(self, path: Path) -> int:
        """Copies a consistent, compacted snapshot of the store into `path`, a
        new directory (its parent must exist) or an empty one, while writers
        go on; returns the size of the copy's data file. The directory is made
        0700 before anything is written in it, so the copy is never readable
        by others, then its file 0600."""
        if self._closed:
            raise ShuttingDown("the store is closed")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            if not path.is_dir() or path.is_symlink():
                raise BackupTargetError(
                    f"{path} exists and is not a directory"
                ) from None
            if any(path.iterdir()):
                raise BackupTargetError(f"{path} is not empty") from None
        except FileNotFoundError:
            raise BackupTargetError(f"the parent of {path} does not exist") from None
        except OSError as exc:
            raise BackupTargetError(f"cannot create {path}: {exc.strerror}") from None
        os.chmod(path, 0o700)
        try:
            with self._env.begin(write=False) as txn:
                self._env.copy(str(path), compact=True, txn=txn)
        except lmdb.Error as exc:
            raise StorageUnavailable(f"the backup to {path} failed: {exc}") from exc
        data = path / "data.mdb"
        os.chmod(data, 0o600)
        return data.stat().st_size

    # -- the writer thread -------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            batch: list[_Item] = [first]  # type: ignore[list-item]
            while len(batch) < self.options.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)  # type: ignore[arg-type]
            with self._txn:
                live = [(fn, w) for fn, w in batch if answers.claim(w)]
                if live:
                    self._commit(live)

    def _commit(self, batch: list[_Item]) -> None:
        """Applies a batch in one transaction, commits, then answers.

        A storage error while one request's writes go into the transaction
        may leave it unusable: the transaction is aborted, that request alone
        fails, and the others are applied again in a new one (write functions
        read everything they decide on from their view, so running one again
        is running it for the first time)."""
        pending = list(batch)
        failpoints = self.options.failpoints
        while pending:
            try:
                with self._env.begin(write=True) as txn:
                    if failpoints is not None:
                        failpoints.reached(Point.LMDB_BEFORE_APPLY, _fns(pending))
                    outcomes, writes = self._apply(txn, pending)
                    if failpoints is not None:
                        failpoints.reached(Point.LMDB_BEFORE_COMMIT, _fns(pending))
                    applied = time.perf_counter()
                committed = time.perf_counter() - applied
            except _RequestFailed as failed:
                _, waiter = pending.pop(failed.index)
                log.error("LMDB refused a request's writes: %s", failed.error)
                error = StorageUnavailable(f"storage write failed: {failed.error}")
                answers.resolve([(waiter, None, error)])
                continue
            except (lmdb.MapFullError, lmdb.TxnFullError) as exc:
                if isinstance(exc, lmdb.MapFullError) and self._clear_stale_readers():
                    continue  # their snapshots' pages are free again
                self._commit_too_big(pending, exc)
                return
            except lmdb.Error as exc:
                log.error("LMDB commit failed: %s", exc)
                failure = self._commit_error(exc)
                answers.resolve([(waiter, None, failure) for _, waiter in pending])
                return
            # Durable now: answer.
            if failpoints is not None:
                failpoints.reached(Point.LMDB_AFTER_COMMIT, _fns(pending))
            self.stats.transactions += 1
            self.stats.writes += writes
            self.stats.largest_batch = max(self.stats.largest_batch, len(pending))
            answers.resolve(outcomes)
            if self.options.on_commit is not None:
                try:
                    self.options.on_commit(len(pending), committed)
                except Exception:  # an observer must never stop the writer
                    log.exception("the commit observer failed")
            return

    def _commit_too_big(self, batch: list[_Item], exc: lmdb.Error) -> None:
        """The map, or one transaction, cannot hold the whole batch: its
        halves are committed in turn, in order, down to single requests, so
        the requests that fit still commit."""
        if len(batch) > 1:
            half = len(batch) // 2
            self._commit(batch[:half])
            self._commit(batch[half:])
            return
        if isinstance(exc, lmdb.MapFullError):
            size = self.options.map_size
            message = f"the storage map of {size} bytes is full"
        else:
            message = "the request writes more than one transaction holds"
        answers.resolve([(batch[0][1], None, StorageFull(message))])

    def _clear_stale_readers(self) -> int:
        """Frees the reader slots of processes that died holding a read
        transaction (a tool killed while it read the store): LMDB keeps
        their snapshot's pages until then, so the map would stay full."""
        stale = int(self._env.reader_check())
        if stale:
            log.warning("cleared %d stale LMDB reader slots", stale)
        return stale

    def _commit_error(self, exc: lmdb.Error) -> StorageFull | StorageUnavailable:
        """What a failed commit is answered. The filesystem full (LMDB says
        ENOSPC, or EIO for a write cut short, with the disk all but full) is
        STORAGE_FULL, as a full map is: the transaction was aborted before
        its meta page, so nothing of it was applied."""
        try:
            fs = os.statvfs(self.path)
            free = fs.f_bavail * fs.f_frsize
        except OSError:
            free = None
        said = str(exc)
        if any(s in said for s in _FULL_DISK) or (
            "Input/output error" in said and free is not None and free < _NEARLY_FULL
        ):
            return StorageFull(
                f"the disk holding the store is full ({free} bytes free): {said}"
            )
        return StorageUnavailable(f"storage commit failed: {said}")

    def _apply(
        self, txn: lmdb.Transaction, batch: list[_Item]
    ) -> tuple[list[answers.Outcome], int]:
        """Runs each write function on its own buffered view; a function
        that raises leaves no writes behind and does not affect the others.
        Returns the outcomes and how many rows were written.

        Raises:
            _RequestFailed: LMDB failed one request's reads or writes.
            lmdb.MapFullError: the map is full.
            lmdb.TxnFullError: the transaction holds as much as it can.
        """
        outcomes: list[answers.Outcome] = []
        writes = 0
        base = TxnView(txn, self._dbs)
        failpoints = self.options.failpoints
        for index, (fn, waiter) in enumerate(batch):
            if index and failpoints is not None:
                failpoints.reached(Point.LMDB_MID_BATCH, _fns(batch))
            view = BufferedView(base, txn, self._dbs, self.options.summarize)
            try:
                value = fn(view)
            except (lmdb.MapFullError, lmdb.TxnFullError):
                raise
            except lmdb.Error as exc:
                raise _RequestFailed(index, exc) from exc
            except Exception as exc:  # the request is refused, others go on
                outcomes.append((waiter, None, exc))
                continue
            try:
                writes += view.flush()
            except (lmdb.MapFullError, lmdb.TxnFullError):
                raise
            except Exception as exc:  # part of its writes may be in the txn
                raise _RequestFailed(index, exc) from exc
            outcomes.append((waiter, value, None))
        return outcomes, writes


def _fns(batch: list[_Item]) -> list[object]:
    return [fn for fn, _ in batch]


class _RequestFailed(Exception):
    """LMDB failed the request at `index` of a batch."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


def _open_incarnation(view: WriteView) -> int:
    found = view.get(Table.META, _FORMAT_KEY)
    if found is None:
        view.put(Table.META, _FORMAT_KEY, FORMAT_VERSION)
    elif found in _UPGRADABLE:
        # The upgrade runs right after (`migration.resume`, then the usage
        # count); if it stops first, the next open resumes it.
        view.put(Table.META, _FORMAT_KEY, FORMAT_VERSION)
        migration.mark_pending(view, found)
    elif found != FORMAT_VERSION:
        raise StoreFormatError(
            f"the data directory has store format {found.decode(errors='replace')}, "
            f"this effectd reads format {FORMAT_VERSION.decode()}"
        )
    incarnation = int(view.get(Table.META, _INCARNATION_KEY) or b"0") + 1
    view.put(Table.META, _INCARNATION_KEY, str(incarnation).encode())
    return incarnation
