"""The LMDB store: durable flags, private files, group commit, isolation of
refused writes, reads that never wait, a clear answer when the map is full."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import lmdb
import pytest

from sidecar.errors import NotFound, ShuttingDown, StorageFull, StorageUnavailable
from sidecar.locking import AlreadyLocked
from sidecar.storage.api import Table, WriteView
from sidecar.storage.keys import KeyTooLong
from sidecar.storage.lmdb.store import (
    LmdbOptions,
    LmdbStore,
    StoreFormatError,
)
from sidecar.storage.lmdb.views import BufferedView, TxnView


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data")
    yield s
    s.close()


def _put(key: bytes, value: bytes) -> Callable[[WriteView], None]:
    def fn(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, key, value)

    return fn


def test_default_flags_are_the_durable_ones(store: LmdbStore) -> None:
    """fsync of data and meta on every commit; no writemap, no map_async."""
    flags = store._env.flags()
    assert flags["sync"]
    assert flags["metasync"]
    assert not flags["writemap"]
    assert not flags["map_async"]


def test_data_directory_is_private(tmp_path: Path) -> None:
    """The directory is 0700 and the LMDB files 0600, whatever the umask."""
    old = os.umask(0o022)
    try:
        s = LmdbStore(tmp_path / "data")
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
        for name in ("data.mdb", "lock.mdb", "effectd.lock"):
            assert stat.S_IMODE((tmp_path / "data" / name).stat().st_mode) == 0o600
    finally:
        s.close()


def test_queued_writes_commit_together(store: LmdbStore) -> None:
    """Requests queued while the writer is busy share one transaction."""
    busy, release = threading.Event(), threading.Event()

    def blocker(view: WriteView) -> None:
        busy.set()
        release.wait(10)

    before = store.stats.transactions
    first = store.submit(blocker)
    assert busy.wait(10)
    queued = [store.submit(_put(b"k%d" % i, b"v")) for i in range(100)]
    release.set()
    first.result(10)
    for f in queued:
        f.result(10)
    assert store.stats.transactions - before == 2
    assert store.stats.largest_batch == 100


def test_a_refused_write_leaves_nothing_and_spares_its_batch(store: LmdbStore) -> None:
    """A write function that raises has no effect; the others in its batch commit."""
    busy, release = threading.Event(), threading.Event()

    def refused(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"bad", b"x")
        raise NotFound("refused")

    def holding(view: WriteView) -> None:
        busy.set()
        release.wait(10)

    gate = store.submit(holding)
    assert busy.wait(10)
    ok1 = store.submit(_put(b"a", b"1"))
    bad = store.submit(refused)
    ok2 = store.submit(_put(b"b", b"2"))
    release.set()
    gate.result(10)
    ok1.result(10)
    ok2.result(10)
    with pytest.raises(NotFound):
        bad.result(10)
    values = store.read(
        lambda v: [v.get(Table.CHECKPOINTS, k) for k in (b"a", b"bad", b"b")]
    )
    assert values == [b"1", None, b"2"]


def test_reads_never_wait_for_the_writer(store: LmdbStore) -> None:
    """A read answers from the last commit while a write transaction is open."""
    store.submit(_put(b"k", b"old")).result(10)
    inside = threading.Event()
    release = threading.Event()

    def slow(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"k", b"new")
        inside.set()
        release.wait(10)

    pending = store.submit(slow)
    assert inside.wait(10)
    # The writer is released only after this read returns: a read that
    # waited for the writer would never return.
    assert store.read(lambda v: v.get(Table.CHECKPOINTS, b"k")) == b"old"
    release.set()
    pending.result(10)
    assert store.read(lambda v: v.get(Table.CHECKPOINTS, b"k")) == b"new"


def test_a_write_function_sees_its_own_writes_in_scans(store: LmdbStore) -> None:
    """Buffered puts and deletes are visible to the same function's scans."""
    store.submit(_put(b"p1", b"a")).result(10)
    store.submit(_put(b"p3", b"c")).result(10)

    def fn(view: WriteView) -> list[tuple[bytes, bytes]]:
        view.put(Table.CHECKPOINTS, b"p2", b"b")
        view.delete(Table.CHECKPOINTS, b"p3")
        view.put(Table.CHECKPOINTS, b"p4", b"d")
        return list(view.scan(Table.CHECKPOINTS, b"p"))

    assert store.submit(fn).result(10) == [(b"p1", b"a"), (b"p2", b"b"), (b"p4", b"d")]


def test_scan_after_and_prefix(store: LmdbStore) -> None:
    """Scans stay inside their prefix and resume strictly after `after`."""
    for k in (b"a\x00x", b"a\x00y", b"a\x00z", b"b\x00x"):
        store.submit(_put(k, b"")).result(10)
    keys = store.read(
        lambda v: [k for k, _ in v.scan(Table.CHECKPOINTS, b"a\x00", after=b"a\x00x")]
    )
    assert keys == [b"a\x00y", b"a\x00z"]


def test_full_map_answers_storage_full_and_keeps_reading(tmp_path: Path) -> None:
    """When the map is full the write is refused with StorageFull; reads go on."""
    s = LmdbStore(tmp_path / "data", LmdbOptions(map_size=1 << 20))
    try:
        s.submit(_put(b"first", b"x")).result(10)
        futures = [
            s.submit(_put(b"big%d" % i, os.urandom(64 << 10))) for i in range(100)
        ]
        errors = [f.exception(10) for f in futures]
        assert any(isinstance(e, StorageFull) for e in errors)
        assert all(e is None or isinstance(e, StorageFull) for e in errors)
        assert s.read(lambda v: v.get(Table.CHECKPOINTS, b"first")) == b"x"
    finally:
        s.close()


def test_incarnation_counts_opens(tmp_path: Path) -> None:
    """Every open of the store is a new, persisted incarnation."""
    for expected in (1, 2, 3):
        s = LmdbStore(tmp_path / "data")
        assert s.incarnation == expected
        s.close()


def test_other_format_version_is_refused(tmp_path: Path) -> None:
    """A data directory of another format is not opened."""
    LmdbStore(tmp_path / "data").close()
    env = lmdb.open(str(tmp_path / "data"), max_dbs=8)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"format_version", b"99")
    env.close()
    with pytest.raises(StoreFormatError, match="format 99"):
        LmdbStore(tmp_path / "data")
    # The failed open released its lock: the next attempt fails the same way.
    with pytest.raises(StoreFormatError):
        LmdbStore(tmp_path / "data")


def test_second_store_on_one_directory_is_refused(store: LmdbStore) -> None:
    """Only one process or store may own a data directory."""
    with pytest.raises(AlreadyLocked, match="in use by another effectd"):
        LmdbStore(store.path)


def test_closed_store_refuses_writes(tmp_path: Path) -> None:
    """After close, submits fail with ShuttingDown instead of hanging."""
    s = LmdbStore(tmp_path / "data")
    s.close()
    future: Future[None] = s.submit(lambda view: None)
    with pytest.raises(ShuttingDown):
        future.result(1)
    with pytest.raises(ShuttingDown):
        s.read(lambda view: None)


# -- one request's storage error never fails its batch neighbours ------------


def _increment(key: bytes) -> Callable[[WriteView], int]:
    """Reads a counter and writes it plus one: applied twice, it shows."""

    def fn(view: WriteView) -> int:
        value = int(view.get(Table.CHECKPOINTS, key) or b"0") + 1
        view.put(Table.CHECKPOINTS, key, str(value).encode())
        return value

    return fn


def _one_batch(
    store: LmdbStore, fns: list[Callable[[WriteView], object]]
) -> list[Future[object]]:
    """Submits `fns` while the writer is held, so they share one batch."""
    inside = threading.Event()
    release = threading.Event()

    def hold(view: WriteView) -> None:
        inside.set()
        release.wait(10)

    held = store.submit(hold)
    assert inside.wait(10)
    futures = [store.submit(fn) for fn in fns]
    release.set()
    held.result(10)
    for future in futures:
        future.exception(10)
    return futures


def _neighbour_problems(
    store: LmdbStore, bad: Callable[[WriteView], None]
) -> list[str]:
    """What went wrong for the good requests of a batch that holds `bad`."""
    futures = _one_batch(store, [_increment(b"n1"), bad, _increment(b"n2")])
    problems = [
        f"neighbour {i} failed: {f.exception()!r}"
        for i, f in zip((0, 2), (futures[0], futures[2]), strict=True)
        if f.exception() is not None
    ]
    if futures[1].exception() is None:
        problems.append("the bad request was applied")
    stored = store.read(lambda v: [v.get(Table.CHECKPOINTS, k) for k in (b"n1", b"n2")])
    if stored != [b"1", b"1"]:
        problems.append(f"neighbours stored {stored}, want each applied once")
    return problems


def _empty_key(view: WriteView) -> None:
    # LMDB refuses it only when the writes go into the transaction (META
    # rows are not counted, so nothing reads the key before).
    view.put(Table.META, b"", b"x")


def _long_key(view: WriteView) -> None:
    view.put(Table.CHECKPOINTS, b"k" * 512, b"x")


def test_a_key_too_long_for_lmdb_fails_only_its_request(store: LmdbStore) -> None:
    """A 512-byte key is refused inside its own write function, as a
    ValueError, and its batch neighbours commit once (issue 10 item A1: fails
    before the fix: the whole batch failed with STORAGE_UNAVAILABLE)."""
    assert _neighbour_problems(store, _long_key) == []
    futures = _one_batch(store, [_long_key])
    assert isinstance(futures[0].exception(), KeyTooLong)


def test_an_lmdb_error_in_one_request_replays_the_batch_without_it(
    store: LmdbStore,
) -> None:
    """LMDB refusing one request's writes aborts the transaction; that
    request alone fails (StorageUnavailable), the others are applied again,
    once, in a new transaction (issue 10 item A1: fails before the fix: every
    request of the batch failed)."""
    before = store.stats.transactions
    assert _neighbour_problems(store, _empty_key) == []
    # The hold, the aborted batch's replay.
    assert store.stats.transactions - before == 2


class _FailsTheBatch(LmdbStore):
    """Negative control: the writer of old, which failed every request of a
    batch when LMDB refused one request's writes."""

    def _commit(self, batch: list[Any]) -> None:
        try:
            with self._env.begin(write=True) as txn:
                outcomes = []
                for fn, future in batch:
                    view = BufferedView(TxnView(txn, self._dbs), txn, self._dbs)
                    outcomes.append((future, fn(view)))
                    view.flush()
        except lmdb.Error as exc:
            for _, future in batch:
                future.set_exception(StorageUnavailable(str(exc)))
            return
        for future, value in outcomes:
            future.set_result(value)


def test_negative_control_a_writer_that_fails_the_batch_is_caught(
    tmp_path: Path,
) -> None:
    """The neighbour check catches a writer that fails the whole batch."""
    s = _FailsTheBatch(tmp_path / "data")
    try:
        assert _neighbour_problems(s, _empty_key) != []
    finally:
        s.close()


class _SmallTransactions(LmdbStore):
    """LMDB's dirty-page limit, made small: a transaction that holds more
    than `limit` requests' writes is full (lmdb.TxnFullError), as one of
    many large checkpoint Txns would be."""

    limit = 2

    def _apply(self, txn: Any, batch: list[Any]) -> Any:
        if len(batch) > self.limit:
            raise lmdb.TxnFullError("mdb_put: MDB_TXN_FULL")
        return super()._apply(txn, batch)


def test_a_full_transaction_is_split_and_every_request_commits(
    tmp_path: Path,
) -> None:
    """A batch too big for one transaction is committed in halves, in order:
    every request commits once (issue 10 item A1: fails before the fix: the
    whole batch, or the request that overflowed, failed with
    STORAGE_UNAVAILABLE)."""
    s = _SmallTransactions(tmp_path / "data")
    try:
        futures = _one_batch(s, [_increment(b"k%d" % i) for i in range(7)])
        assert [f.exception() for f in futures] == [None] * 7
        stored = s.read(
            lambda v: [v.get(Table.CHECKPOINTS, b"k%d" % i) for i in range(7)]
        )
        assert stored == [b"1"] * 7
        assert s.stats.largest_batch <= _SmallTransactions.limit
    finally:
        s.close()


# -- writes awaited on an event loop (`LmdbStore.write`) ---------------------


def _held(store: LmdbStore) -> tuple[Future[None], threading.Event]:
    """Holds the writer busy until the returned event is set."""
    busy, release = threading.Event(), threading.Event()

    def holding(view: WriteView) -> None:
        busy.set()
        release.wait(10)

    gate = store.submit(holding)
    assert busy.wait(10)
    return gate, release


def test_loop_writes_are_answered_after_their_commit_in_one_wake(
    store: LmdbStore,
) -> None:
    """Each awaited write returns its value once its commit is readable, and
    the writes of one batch wake their loop once (a wrapped concurrent
    future woke it once per write)."""

    async def main() -> tuple[list[bool], int]:
        loop = asyncio.get_running_loop()
        wakes = 0
        threadsafe = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return threadsafe(*args, **kwargs)

        setattr(loop, "call_soon_threadsafe", counted)  # noqa: B010
        gate, release = _held(store)

        async def one(i: int) -> bool:
            key = b"w%d" % i
            await store.write(_put(key, b"v"))
            return store.read(lambda v: v.get(Table.CHECKPOINTS, key)) == b"v"

        tasks = [asyncio.create_task(one(i)) for i in range(20)]
        await asyncio.sleep(0.05)  # every write queued behind the held one
        release.set()
        seen = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        gate.result(10)
        return seen, wakes

    seen, wakes = asyncio.run(main())
    assert seen == [True] * 20
    assert wakes == 1


def test_a_loop_write_cancelled_before_the_writer_takes_it_is_not_applied(
    store: LmdbStore,
) -> None:
    """A message cancelled while its write waits in the queue writes nothing."""

    async def main() -> None:
        gate, release = _held(store)
        task = asyncio.create_task(store.write(_put(b"gone", b"v")))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await store.write(_put(b"after", b"v"))
        gate.result(10)

    asyncio.run(main())
    assert store.read(lambda v: v.get(Table.CHECKPOINTS, b"gone")) is None
    assert store.read(lambda v: v.get(Table.CHECKPOINTS, b"after")) == b"v"


def test_a_refused_loop_write_raises_and_spares_its_batch(store: LmdbStore) -> None:
    """What a write function raises is raised where it is awaited; the
    others of its batch commit."""

    def refused(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"bad", b"x")
        raise NotFound("refused")

    async def main() -> None:
        gate, release = _held(store)
        ok = asyncio.create_task(store.write(_put(b"a", b"1")))
        bad = asyncio.create_task(store.write(refused))
        await asyncio.sleep(0.05)
        release.set()
        await ok
        with pytest.raises(NotFound):
            await bad
        gate.result(10)

    asyncio.run(main())
    values = store.read(lambda v: [v.get(Table.CHECKPOINTS, k) for k in (b"a", b"bad")])
    assert values == [b"1", None]


def test_closed_store_refuses_loop_writes(tmp_path: Path) -> None:
    """After close, an awaited write raises ShuttingDown instead of hanging."""
    s = LmdbStore(tmp_path / "data")
    s.close()
    with pytest.raises(ShuttingDown):
        asyncio.run(s.write(lambda view: None))


def test_the_writes_of_one_pass_of_the_loop_commit_together_on_it(
    store: LmdbStore,
) -> None:
    """Writes awaited in one pass of the loop share one transaction,
    committed on the loop's own thread, and wake no thread to answer."""

    async def main() -> tuple[list[bool], set[str], int]:
        loop = asyncio.get_running_loop()
        wakes = 0
        threadsafe = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return threadsafe(*args, **kwargs)

        setattr(loop, "call_soon_threadsafe", counted)  # noqa: B010
        threads: set[str] = set()

        def put(key: bytes) -> Callable[[WriteView], None]:
            def fn(view: WriteView) -> None:
                threads.add(threading.current_thread().name)
                view.put(Table.CHECKPOINTS, key, b"v")

            return fn

        async def one(i: int) -> bool:
            key = b"p%d" % i
            await store.write(put(key))
            return store.read(lambda v: v.get(Table.CHECKPOINTS, key)) == b"v"

        seen = await asyncio.gather(*(one(i) for i in range(20)))
        return seen, threads, wakes

    before = store.stats.transactions
    seen, threads, wakes = asyncio.run(main())
    assert seen == [True] * 20
    assert store.stats.transactions - before == 1
    assert threads == {threading.current_thread().name}
    assert wakes == 0


def test_a_refused_write_on_the_loop_raises_and_spares_its_batch(
    store: LmdbStore,
) -> None:
    """The isolation of a refused request holds for a batch of the loop."""

    def refused(view: WriteView) -> None:
        view.put(Table.CHECKPOINTS, b"bad", b"x")
        raise NotFound("refused")

    async def main() -> list[BaseException | None]:
        got = await asyncio.gather(
            store.write(_put(b"a", b"1")),
            store.write(refused),
            store.write(_put(b"b", b"2")),
            return_exceptions=True,
        )
        return [g if isinstance(g, BaseException) else None for g in got]

    before = store.stats.transactions
    a, bad, b = asyncio.run(main())
    assert a is None
    assert b is None
    assert isinstance(bad, NotFound)
    assert store.stats.transactions - before == 1
    values = store.read(
        lambda v: [v.get(Table.CHECKPOINTS, k) for k in (b"a", b"bad", b"b")]
    )
    assert values == [b"1", None, b"2"]


def test_writes_gathered_when_the_store_closes_are_refused(tmp_path: Path) -> None:
    """A write gathered on the loop when the store closes before its pass
    ends answers ShuttingDown, never hangs."""
    s = LmdbStore(tmp_path / "data")

    async def main() -> None:
        pending = asyncio.ensure_future(s.write(_put(b"k", b"v")))
        await asyncio.sleep(0)  # gathered; its commit is due next pass
        s.close()
        with pytest.raises(ShuttingDown):
            await asyncio.wait_for(pending, 10)

    asyncio.run(main())


def test_loops_in_two_threads_each_commit_their_own_writes(store: LmdbStore) -> None:
    """Two event loops writing at once, each in its own thread: every write
    is answered and committed once (each loop gathers its own)."""
    results: dict[int, list[int]] = {}

    def run(n: int) -> None:
        async def main() -> list[int]:
            return await asyncio.gather(
                *(store.write(_increment(b"loops-%d" % (i % 5))) for i in range(50))
            )

        results[n] = asyncio.run(main())

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1]
    totals = store.read(
        lambda v: [
            int(v.get(Table.CHECKPOINTS, b"loops-%d" % k) or b"0") for k in range(5)
        ]
    )
    assert totals == [20] * 5
