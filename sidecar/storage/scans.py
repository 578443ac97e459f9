"""Long reads of the store, run on worker threads instead of the event loop.

A listing, the statistics, an audit verification or a compaction scan reads
(and decodes, or hashes) many rows: on the event loop it would hold up every
other request and every provider stream until it ends. `Scans` runs each such
read function on a worker thread, in a read-only transaction that thread opens
and closes itself (an LMDB read transaction stays on the thread that opened
it), and never waits for the writer (MVCC). At most `limit` scans run at once,
the others queue on the loop, so that many concurrent scans cannot take the
interpreter from the writer thread; writes, and their reply after the commit,
are untouched.

A scan whose caller has gone (its deadline passed, its RPC was cancelled)
stops at the next row it reads, and its slot is given back only once its
thread has ended. `close` stops every running scan the same way and waits for
their threads, so the store can then be closed under no reader.

A point read (a record, a checkpoint: a few keys) goes through `point_read`:
inline on a store whose reads never wait (LMDB), where a hop to a thread would
cost more than the read; on a store whose reads may wait (PostgreSQL: a pooled
connection, a round trip to the server) on a point thread (`_PointThreads`,
handed over a queue, cheaper than the loop's executor), without a slot
(the store's read pool bounds them), so that one slow read holds up its own
request only, never the loop. Its thread is stopped and waited for as a
scan's is.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from sidecar.errors import ShuttingDown
from sidecar.ledger.audit import Head
from sidecar.ledger.checkpoints import StoredCheckpoint
from sidecar.ledger.model import CallRef, State, ToolCall
from sidecar.ledger.ownership import PassLock, Registration
from sidecar.ledger.quota import Usage
from sidecar.ledger.retention import Tombstone
from sidecar.storage.api import Listed, ReadsPoints, ReadView, Store, Table
from sidecar.storage.handoff import hand_back

T = TypeVar("T")
R = TypeVar("R")

# Scans running at once. The machine's cores are shared with the writer
# thread, the event loop and gRPC's own threads; two keep a listing from
# waiting behind a long verification without starving the writer.
DEFAULT_LIMIT = 2


# A read handed to a point thread: the loop that awaits it, its future there,
# and the read.
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class _PointThreads:
    """The threads of the point reads: each read is handed over a queue and
    answers on its caller's loop (`call_soon_threadsafe`), with none of
    `run_in_executor`'s two futures (a concurrent one, and the asyncio one
    chained to it), which cost about as much CPU as the read's own round
    trip. As many threads as the loop's default executor would run, all
    started at the first read; a forked child starts its own."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._started = False

    def submit(self, read: Callable[[], T]) -> asyncio.Future[T]:
        """`read` on one of the threads; its outcome, on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._started:
            self._start()
        self._jobs.put((loop, future, read))
        return future

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            for n in range(self._size):
                threading.Thread(
                    target=self._serve,
                    args=(self._jobs,),
                    name=f"effectd-point-{n}",
                    daemon=True,
                ).start()
            self._started = True

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            loop, future, read = jobs.get()
            value, error = None, None
            try:
                value = read()
            except BaseException as exc:  # the caller's to see
                error = exc
            hand_back(loop, future, value, error)
            del loop, future, read, value, error


_POINT_THREADS = _PointThreads(min(32, (os.cpu_count() or 1) + 4))


class _Stop:
    """Set from the loop's thread, read by the scan's: why it must stop."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason = ""


class _StoppableView:
    """A `ReadView` that raises `ShuttingDown` at the next row once stopped:
    each read is the wrapped view's own (a store's way of reading the
    ledger), checked before each key and row."""

    def __init__(self, view: ReadView, stop: _Stop) -> None:
        self._view = view
        self._stop = stop

    def _check(self) -> None:
        if self._stop.reason:
            raise ShuttingDown(self._stop.reason)

    def get(self, table: Table, key: bytes) -> bytes | None:
        self._check()
        return self._view.get(table, key)

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self._checked(self._view.scan(table, prefix, after=after))

    def _checked(self, rows: Iterator[R]) -> Iterator[R]:
        for row in rows:
            self._check()
            yield row

    def load_call(self, ref: CallRef) -> ToolCall | None:
        self._check()
        return self._view.load_call(ref)

    def load_call_at(self, key: bytes) -> ToolCall | None:
        self._check()
        return self._view.load_call_at(key)

    def find_call(self, ref: CallRef) -> tuple[ToolCall | None, Tombstone | None]:
        self._check()
        return self._view.find_call(ref)

    def calls(
        self, prefix: bytes, *, after: bytes | None = None, history: bool = True
    ) -> Iterator[tuple[bytes, Listed]]:
        return self._checked(self._view.calls(prefix, after=after, history=history))

    def calls_in_state(
        self, state: State, namespace: str | None = None, *, after: bytes | None = None
    ) -> Iterator[bytes]:
        return self._checked(self._view.calls_in_state(state, namespace, after=after))

    def plan(
        self, prefix: bytes, *, after: bytes | None = None, rows: bool = True
    ) -> Iterator[tuple[bytes, Listed | bytes]]:
        return self._checked(self._view.plan(prefix, after=after, rows=rows))

    def retained(
        self, *, acknowledged: bool, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self._checked(
            self._view.retained(acknowledged=acknowledged, after=after)
        )

    def load_checkpoint(self, namespace: str, key: str) -> StoredCheckpoint | None:
        self._check()
        return self._view.load_checkpoint(namespace, key)

    def checkpoints(
        self, namespace: str, prefix: str, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, StoredCheckpoint]]:
        return self._checked(self._view.checkpoints(namespace, prefix, after=after))

    def usage(self, namespace: str) -> Usage:
        self._check()
        return self._view.usage(namespace)

    def usages(self) -> dict[str, Usage]:
        self._check()
        return self._view.usages()

    def audit_head(self) -> Head | None:
        self._check()
        return self._view.audit_head()

    def audit_entry(self, sequence: int) -> bytes | None:
        self._check()
        return self._view.audit_entry(sequence)

    def audit_entries(self, after: int = 0) -> Iterator[tuple[int, bytes]]:
        return self._checked(self._view.audit_entries(after))

    def registration(self, incarnation: int) -> Registration | None:
        self._check()
        return self._view.registration(incarnation)

    def registrations(self) -> Iterator[Registration]:
        return self._checked(self._view.registrations())

    def pass_lock(self, name: str) -> PassLock | None:
        self._check()
        return self._view.pass_lock(name)

    def refuse_unfinished_restore(self) -> None:
        self._check()
        self._view.refuse_unfinished_restore()


class Scans:
    """Runs the long read functions of one store on worker threads, a bounded
    number at a time, and its point reads where they cost the loop least;
    one per store, shared by the services that read it."""

    def __init__(self, store: Store, *, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit: must be at least 1")
        self._store = store
        # Asked once: a runtime-checkable Protocol's isinstance walks its
        # members each time (about 5 us, on every point read).
        self._reads_points = isinstance(store, ReadsPoints)
        self.limit = limit
        # Bound to the loop of its first use.
        self._slots = asyncio.Semaphore(limit)
        self._running: dict[asyncio.Future[Any], _Stop] = {}
        self._closed = False

    @property
    def running(self) -> int:
        """Reads (scans, point reads) whose thread has not ended yet."""
        return len(self._running)

    async def read(self, fn: Callable[[ReadView], T]) -> T:
        """`fn` on a consistent snapshot, run on a worker thread.

        Raises:
            ShuttingDown: `close` was called, before or while `fn` ran.
        """
        if self._closed:
            raise ShuttingDown("the store is closing")
        await self._slots.acquire()
        try:
            if self._closed:
                raise ShuttingDown("the store is closing")
            work, stop = self._start(fn, point=False)
        except BaseException:
            self._slots.release()
            raise
        # The slot stays taken until the thread has ended.
        work.add_done_callback(lambda _: self._slots.release())
        return await self._outcome(work, stop, "the scan's caller has gone")

    async def point_read(self, fn: Callable[[ReadView], T]) -> T:
        """`fn`, a read of a few keys: inline when the store's reads never
        wait (`Store.reads_wait`), on a snapshot; else on a worker thread, each
        key on a snapshot of its own where the store offers it
        (`api.ReadsPoints`), for a decision its write then holds by
        compare-and-swap.

        Raises:
            ShuttingDown: the store is closed; off the loop, also when
                `close` was called before or while `fn` ran.
        """
        if not self._store.reads_wait:
            return self._store.read(fn)
        if self._closed:
            raise ShuttingDown("the store is closing")
        work, stop = self._start(fn, point=True)
        return await self._outcome(work, stop, "the read's caller has gone")

    def _start(
        self, fn: Callable[[ReadView], T], *, point: bool
    ) -> tuple[asyncio.Future[T], _Stop]:
        stop = _Stop()

        def run(view: ReadView) -> T:
            return fn(_StoppableView(view, stop))

        # In the caller's context, as `asyncio.to_thread` does: what the read
        # logs names the request it serves.
        context = contextvars.copy_context()
        store = self._store
        read: Callable[[Callable[[ReadView], T]], T] = store.read
        if point and self._reads_points:
            read = cast(ReadsPoints, store).read_point
        work: asyncio.Future[T]
        if point:
            work = _POINT_THREADS.submit(functools.partial(context.run, read, run))
        else:
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(None, context.run, read, run)
        self._running[work] = stop
        work.add_done_callback(self._ended)
        return work, stop

    @staticmethod
    async def _outcome(work: asyncio.Future[T], stop: _Stop, gone: str) -> T:
        try:
            # Shielded: a cancelled caller stops the thread at its next row
            # or key, it cannot abandon it (nor the pooled connection the
            # thread holds).
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.reason = gone
            raise

    def _ended(self, work: asyncio.Future[Any]) -> None:
        del self._running[work]
        if not work.cancelled():
            # Retrieved: a stopped read's error has no caller left to see it.
            work.exception()

    async def close(self) -> None:
        """Refuses new scans (and point reads off the loop), stops the
        running ones at their next row or key and waits for their threads
        to end. Call it before closing the store: closing an LMDB environment
        under a reader on another thread is not safe."""
        self._closed = True
        for stop in self._running.values():
            stop.reason = "the daemon is stopping"
        if self._running:
            await asyncio.wait(list(self._running))
