"""`Scans`: long reads run on worker threads, a bounded number at a time, and
stop at their next row once their caller has gone or the store is closing.

A scan is held at a row by a `threading.Event` the test sets, so what runs
when is decided by the test, never by timing."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from sidecar.errors import ShuttingDown
from sidecar.storage.api import ReadsPoints, ReadView, Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.scans import Scans

T = TypeVar("T")

ROWS = 50
# A bound on every wait; reached only when the code under test is broken.
WAIT = 30.0


def _filled(s: LmdbStore) -> Iterator[LmdbStore]:
    """`s` holding ROWS rows, closed after the test."""

    def fill(view: WriteView) -> None:
        for i in range(ROWS):
            view.put(Table.CHECKPOINTS, b"row-%03d" % i, b"x")

    s.submit(fill).result()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    yield from _filled(LmdbStore(tmp_path / "data", LmdbOptions(sync=False)))


class Held:
    """A read function that scans every row and waits at row `at` until the
    test lets it go; it records the rows it read and how it ended."""

    def __init__(self, at: int = 10) -> None:
        self.at = at
        self.reached = threading.Event()
        self.go = threading.Event()
        self.rows = 0
        self.thread = 0
        self.error: BaseException | None = None

    def __call__(self, view: ReadView) -> int:
        self.thread = threading.get_ident()
        try:
            for _ in view.scan(Table.CHECKPOINTS, b"row-"):
                self.rows += 1
                if self.rows == self.at:
                    self.reached.set()
                    assert self.go.wait(WAIT)
        except BaseException as exc:
            self.error = exc
            raise
        return self.rows


async def _reached(held: Held) -> None:
    assert await asyncio.to_thread(held.reached.wait, WAIT)


async def _until_idle(scans: Scans) -> None:
    for _ in range(int(WAIT / 0.01)):
        if scans.running == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the scan's thread never ended")


def test_a_scan_runs_on_a_worker_thread_while_the_loop_and_writer_go_on(
    store: LmdbStore,
) -> None:
    """While a scan is held on its row, the loop runs other tasks and the
    writer commits; the scan then reads its own snapshot to the end."""

    async def scenario() -> None:
        scans = Scans(store)
        held = Held()
        task = asyncio.create_task(scans.read(held))
        await _reached(held)
        assert held.thread != threading.get_ident()

        def more(view: WriteView) -> None:
            view.put(Table.CHECKPOINTS, b"row-999", b"x")

        await asyncio.wrap_future(store.submit(more))
        assert not task.done()
        held.go.set()
        assert await task == ROWS  # its snapshot predates the write

    asyncio.run(scenario())


@pytest.mark.parametrize(("limit", "together"), [(1, False), (2, True)])
def test_at_most_limit_scans_run_at_once(
    store: LmdbStore, limit: int, together: bool
) -> None:
    """With a limit of one, a second scan starts only once the first has
    ended; with two (the control), it starts while the first is held."""

    async def scenario() -> None:
        scans = Scans(store, limit=limit)
        first, second = Held(), Held()
        one = asyncio.create_task(scans.read(first))
        await _reached(first)
        two = asyncio.create_task(scans.read(second))
        # Either the second scan reaches its row while the first is held, or
        # it is queued on the loop, never submitted to a thread.
        for _ in range(20):
            await asyncio.sleep(0)
        if together:
            await _reached(second)
        else:
            assert scans.running == 1
            assert not second.reached.is_set()
        first.go.set()
        second.go.set()
        assert await one == ROWS
        assert await two == ROWS

    asyncio.run(scenario())


def test_a_cancelled_scan_stops_at_its_next_row_and_keeps_its_slot_till_then(
    store: LmdbStore,
) -> None:
    """A deadline or a cancelled RPC cancels the caller: its thread reads no
    further than its next row, and no other scan starts before it has ended."""

    async def scenario() -> None:
        scans = Scans(store, limit=1)
        held, after = Held(), Held(at=ROWS)
        task = asyncio.create_task(scans.read(held))
        await _reached(held)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        queued = asyncio.create_task(scans.read(after))
        await asyncio.sleep(0)
        assert scans.running == 1  # the held thread still owns the slot
        held.go.set()
        after.go.set()
        assert await queued == ROWS
        await _until_idle(scans)
        assert held.rows == held.at
        assert isinstance(held.error, ShuttingDown)

    asyncio.run(scenario())


def test_close_stops_the_running_scans_waits_for_them_and_refuses_new_ones(
    store: LmdbStore,
) -> None:
    """The store may be closed once `close` returns: no thread reads it."""

    async def scenario() -> None:
        scans = Scans(store)
        held = Held()
        task = asyncio.create_task(scans.read(held))
        await _reached(held)
        closing = asyncio.create_task(scans.close())
        await asyncio.sleep(0)
        assert not closing.done()  # waits for the held thread
        held.go.set()
        await closing
        assert scans.running == 0
        with pytest.raises(ShuttingDown):
            await task
        assert held.rows == held.at
        with pytest.raises(ShuttingDown):
            await scans.read(Held())

    asyncio.run(scenario())


def test_a_limit_below_one_is_refused(store: LmdbStore) -> None:
    with pytest.raises(ValueError, match="limit"):
        Scans(store, limit=0)


def test_a_scan_cancelled_while_queued_never_runs(store: LmdbStore) -> None:
    """A caller whose deadline passes while it waits for a slot leaves no
    work behind: its read function is never called."""

    async def scenario() -> None:
        scans = Scans(store, limit=1)
        held, queued = Held(), Held()
        one = asyncio.create_task(scans.read(held))
        await _reached(held)
        two = asyncio.create_task(scans.read(queued))
        await asyncio.sleep(0)
        two.cancel()
        with pytest.raises(asyncio.CancelledError):
            await two
        held.go.set()
        assert await one == ROWS
        await _until_idle(scans)
        assert queued.thread == 0  # never called

    asyncio.run(scenario())


REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="")


def test_a_scan_runs_in_its_callers_context(store: LmdbStore) -> None:
    """What a scan logs names the request it serves (its trace context)."""

    async def scenario() -> None:
        REQUEST.set("req-7")
        assert await Scans(store).read(lambda _: REQUEST.get()) == "req-7"

    asyncio.run(scenario())


class WaitingLmdbStore(LmdbStore):
    """An LMDB store that says its reads may wait, as PostgreSQL's do: its
    point reads take the worker thread a PostgreSQL read takes."""

    reads_wait = True


@pytest.fixture
def waiting(tmp_path: Path) -> Iterator[LmdbStore]:
    yield from _filled(WaitingLmdbStore(tmp_path / "waiting", LmdbOptions(sync=False)))


def test_a_point_read_of_a_store_whose_reads_never_wait_runs_inline(
    store: LmdbStore,
) -> None:
    """LMDB: a point read runs on the loop's own thread, no hop to a thread;
    and, inline, it reads as the store does once the scans are closed."""

    async def scenario() -> None:
        scans = Scans(store)
        held = Held(at=ROWS + 1)
        assert await scans.point_read(held) == ROWS
        assert held.thread == threading.get_ident()
        await scans.close()
        assert await scans.point_read(lambda v: v.get(Table.CHECKPOINTS, b"row-001"))

    asyncio.run(scenario())


def test_a_point_read_of_a_store_whose_reads_may_wait_runs_on_a_thread(
    waiting: LmdbStore,
) -> None:
    """While a point read is held, the loop runs other tasks, and other point
    reads, beyond the scans' limit; it runs in its caller's context."""

    async def scenario() -> None:
        scans = Scans(waiting, limit=1)
        REQUEST.set("req-9")
        held = Held()
        task = asyncio.create_task(scans.point_read(held))
        await _reached(held)
        assert held.thread != threading.get_ident()
        assert await scans.point_read(lambda _: REQUEST.get()) == "req-9"
        assert not task.done()
        held.go.set()
        assert await task == ROWS
        await _until_idle(scans)

    asyncio.run(scenario())


def test_a_point_reads_error_reaches_its_caller(waiting: LmdbStore) -> None:
    """What a read on a point thread raises is its caller's, the thread goes
    on serving; StopIteration, which a future cannot hold, arrives as a
    RuntimeError rather than leaving its caller waiting."""

    def fails(error: Exception) -> Callable[[ReadView], None]:
        def read(_: ReadView) -> None:
            raise error

        return read

    async def scenario() -> None:
        scans = Scans(waiting)
        with pytest.raises(KeyError, match="gone"):
            await scans.point_read(fails(KeyError("gone")))
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(scans.point_read(fails(StopIteration())), WAIT)
        assert await scans.point_read(lambda v: v.get(Table.CHECKPOINTS, b"row-001"))
        await _until_idle(scans)

    asyncio.run(scenario())


def test_a_forked_child_serves_point_reads_on_threads_of_its_own(
    waiting: LmdbStore, tmp_path: Path
) -> None:
    """A child forked after the parent's point threads started has none of
    them: its first point read starts its own, rather than waiting forever."""

    async def one(s: LmdbStore) -> bytes | None:
        return await Scans(s).point_read(lambda v: v.get(Table.META, b"k"))

    asyncio.run(one(waiting))
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's outcome is its exit code
        code = 1
        try:
            fresh = WaitingLmdbStore(tmp_path / "child", LmdbOptions(sync=False))
            fresh.submit(lambda view: view.put(Table.META, b"k", b"c")).result()
            value = asyncio.run(asyncio.wait_for(one(fresh), WAIT))
            code = 0 if value == b"c" else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_cancelled_point_read_stops_at_its_next_key_and_close_waits_for_it(
    waiting: LmdbStore,
) -> None:
    """A caller gone (its deadline passed) stops its read's thread at the next
    key it reads; `close` waits for that thread, then refuses new reads."""

    async def scenario() -> None:
        scans = Scans(waiting)
        held = Held()
        task = asyncio.create_task(scans.point_read(held))
        await _reached(held)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        closing = asyncio.create_task(scans.close())
        await asyncio.sleep(0)
        assert not closing.done()  # waits for the held thread
        held.go.set()
        await closing
        assert scans.running == 0
        assert held.rows == held.at
        assert isinstance(held.error, ShuttingDown)
        with pytest.raises(ShuttingDown):
            await scans.point_read(Held())

    asyncio.run(scenario())


class _CountingPostgresStore(PostgresStore):
    """Counts the reads on a snapshot and the point reads it serves."""

    def __init__(self, url: str) -> None:
        super().__init__(url, PostgresOptions(readers=1))
        self.snapshots = 0
        self.points = 0

    def read(self, fn: Callable[[ReadView], T]) -> T:
        self.snapshots += 1
        return super().read(fn)

    def read_point(self, fn: Callable[[ReadView], T]) -> T:
        self.points += 1
        return super().read_point(fn)


def test_point_reads_of_postgresql_need_no_snapshot_and_scans_keep_theirs(
    pg_url: str,
) -> None:
    """On PostgreSQL a point read is served outside a transaction (each key
    one statement), and sees what was committed; a scan still reads one
    snapshot. LMDB offers no such read: its point reads run inline."""
    store = _CountingPostgresStore(pg_url)
    try:
        store.submit(lambda view: view.put(Table.META, b"k", b"v")).result(10)
        scans = Scans(store)

        async def both() -> tuple[bytes | None, list[tuple[bytes, bytes]]]:
            point = await scans.point_read(lambda view: view.get(Table.META, b"k"))
            scanned = await scans.read(lambda view: list(view.scan(Table.META, b"k")))
            await scans.close()
            return point, scanned

        assert asyncio.run(both()) == (b"v", [(b"k", b"v")])
        assert (store.points, store.snapshots) == (1, 1)
    finally:
        store.close()
    assert isinstance(store, ReadsPoints)
    assert not issubclass(LmdbStore, ReadsPoints)
