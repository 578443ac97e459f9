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
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sidecar.errors import ShuttingDown
from sidecar.storage.api import ReadView, Store, Table

T = TypeVar("T")

# Scans running at once. The machine's cores are shared with the writer
# thread, the event loop and gRPC's own threads; two keep a listing from
# waiting behind a long verification without starving the writer.
DEFAULT_LIMIT = 2


class _Stop:
    """Set from the loop's thread, read by the scan's: why it must stop."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason = ""


class _StoppableView:
    """A `ReadView` that raises `ShuttingDown` at the next row once stopped."""

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
        for row in self._view.scan(table, prefix, after=after):
            self._check()
            yield row


class Scans:
    """Runs the long read functions of one store on worker threads, a bounded
    number at a time; one per store, shared by the services that read it."""

    def __init__(self, store: Store, *, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit: must be at least 1")
        self._store = store
        self.limit = limit
        # Bound to the loop of its first use.
        self._slots = asyncio.Semaphore(limit)
        self._running: dict[asyncio.Future[Any], _Stop] = {}
        self._closed = False

    @property
    def running(self) -> int:
        """Scans whose thread has not ended yet."""
        return len(self._running)

    async def read(self, fn: Callable[[ReadView], T]) -> T:
        """`fn` on a consistent snapshot, run on a worker thread.

        Raises:
            ShuttingDown: `close` was called, before or while `fn` ran.
        """
        if self._closed:
            raise ShuttingDown("the store is closing")
        await self._slots.acquire()
        stop = _Stop()
        try:
            if self._closed:
                raise ShuttingDown("the store is closing")

            def run(view: ReadView) -> T:
                return fn(_StoppableView(view, stop))

            # In the caller's context, as `asyncio.to_thread` does: what the
            # scan logs names the request it serves.
            context = contextvars.copy_context()
            work = asyncio.get_running_loop().run_in_executor(
                None, context.run, self._store.read, run
            )
        except BaseException:
            self._slots.release()
            raise
        self._running[work] = stop
        work.add_done_callback(self._ended)
        try:
            # Shielded: a cancelled caller stops the thread, it cannot abandon
            # it, and the slot stays taken until the thread has ended.
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.reason = "the scan's caller has gone"
            raise

    def _ended(self, work: asyncio.Future[Any]) -> None:
        del self._running[work]
        self._slots.release()
        if not work.cancelled():
            # Retrieved: a stopped scan's error has no caller left to see it.
            work.exception()

    async def close(self) -> None:
        """Refuses new scans, stops the running ones at their next row and
        waits for their threads to end. Call it before closing the store:
        closing an LMDB environment under a reader on another thread is not
        safe."""
        self._closed = True
        for stop in self._running.values():
            stop.reason = "the daemon is stopping"
        if self._running:
            await asyncio.wait(list(self._running))
