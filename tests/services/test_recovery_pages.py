"""The recovery service never holds the writer for the size of a run: a
page is read on a snapshot; only the calls it changes go through the writer,
in one transaction per page; a run with nothing to settle is recovered
without a write. Negative control: the whole-run transaction of before
(every record of the run rewritten by one write function) is caught."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sidecar.clock import ManualClock
from sidecar.ledger import rules
from sidecar.ledger.model import Effect, State
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.validation import Limits
from sidecar.services._common import moment
from sidecar.services.ledger import LedgerService
from sidecar.services.recovery import RecoveryService
from sidecar.storage import calls, keys, records
from sidecar.storage.api import CallWrite, ReadView, Store, Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from sidecar.storage.table_ledger import TableLedger
from tests.services.support import spec

T = TypeVar("T")
CALLS = 250
PAGE = 100


class _CountingView(TableLedger):
    """A `WriteView` that counts the records put."""

    def __init__(self, inner: WriteView) -> None:
        self._inner = inner
        self.summarize = inner.summarize
        self.records = 0

    def get(self, table: Table, key: bytes) -> bytes | None:
        return self._inner.get(table, key)

    def scan(self, table: Table, prefix: bytes, *, after: bytes | None = None) -> Any:
        return self._inner.scan(table, prefix, after=after)

    def put(self, table: Table, key: bytes, value: bytes) -> None:
        self.records += table is Table.CALLS
        self._inner.put(table, key, value)

    def delete(self, table: Table, key: bytes) -> None:
        self._inner.delete(table, key)


class _Watched:
    """A `Store` that records how many records each write function put."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.writes: list[int] = []

    @property
    def incarnation(self) -> int:
        return self._inner.incarnation

    @property
    def exclusive(self) -> bool:
        return self._inner.exclusive

    @property
    def reads_wait(self) -> bool:
        return self._inner.reads_wait

    @property
    def saves_by_statement(self) -> bool:
        return self._inner.saves_by_statement

    def read(self, fn: Callable[[ReadView], T]) -> T:
        return self._inner.read(fn)

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        return self._inner.submit(self._counted(fn))

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        return await self._inner.write(self._counted(fn))

    async def save_call(self, write: CallWrite) -> None:
        await self.write(functools.partial(calls.compare_and_save, write=write))

    def _counted(self, fn: Callable[[WriteView], T]) -> Callable[[WriteView], T]:
        def counted(view: WriteView) -> T:
            counting = _CountingView(view)
            try:
                return fn(counting)
            finally:
                self.writes.append(counting.records)

        return counted

    def close(self) -> None:
        self._inner.close()

    def backup(self, path: Path) -> int:
        return self._inner.backup(path)


@pytest.fixture
def lmdb(tmp_path: Path) -> Iterator[LmdbStore]:
    store = LmdbStore(tmp_path / "data", LmdbOptions(map_size=64 << 20, sync=False))
    yield store
    store.close()


def _fill(store: Store, clock: ManualClock, *, start: bool) -> None:
    ledger = LedgerService(store, clock, Limits(), FixedPolicy())
    specs = [spec(f"c{i:04d}", Effect.SIDE_EFFECT, start=start) for i in range(CALLS)]
    asyncio.run(ledger.prepare_many(specs))


def _recover_in_pages(service: RecoveryService) -> int:
    async def run() -> int:
        settled, token = 0, ""
        while True:
            page = await service.recover_page(
                "default", "run-1", page_size=PAGE, page_token=token
            )
            settled += page.settled
            token = page.next_page_token
            if not token:
                return settled

    return asyncio.run(run())


def test_each_write_of_a_recovery_is_bounded_by_its_page(lmdb: LmdbStore) -> None:
    """250 stale STARTED calls, pages of 100: three writes of at most 100
    records, and every call UNKNOWN after."""
    clock = ManualClock()
    _fill(lmdb, clock, start=True)
    clock.advance(3600)
    watched = _Watched(lmdb)
    service = RecoveryService(watched, clock, Limits(), FixedPolicy())
    assert _recover_in_pages(service) == CALLS
    assert watched.writes == [100, 100, 50]
    states = lmdb.read(
        lambda v: {
            records.decode_call(raw).state for _, raw in v.scan(Table.CALLS, b"")
        }
    )
    assert states == {State.UNKNOWN}


def test_a_run_with_nothing_to_settle_is_recovered_without_a_write(
    lmdb: LmdbStore,
) -> None:
    clock = ManualClock()
    _fill(lmdb, clock, start=False)
    watched = _Watched(lmdb)
    service = RecoveryService(watched, clock, Limits(), FixedPolicy())
    assert _recover_in_pages(service) == 0
    assert watched.writes == []
    whole = asyncio.run(service.recover("default", "run-1"))
    assert len(whole.plan.items) == CALLS
    assert watched.writes == []


def test_negative_control_a_whole_run_transaction_is_caught(
    lmdb: LmdbStore,
) -> None:
    """The recovery of before: one write function that reads and rewrites
    the whole run. The bound of the test above catches it."""
    clock = ManualClock()
    _fill(lmdb, clock, start=True)
    clock.advance(3600)
    watched = _Watched(lmdb)

    def whole_run(view: WriteView) -> None:
        now = moment(clock, lmdb, view)
        prefix = keys.run_prefix("default", "run-1")
        for _, raw in list(view.scan(Table.CALLS, prefix)):
            old = records.decode_call(raw)
            records.save_call(view, old, rules.settle(old, now))

    watched.submit(whole_run).result()
    assert watched.writes == [CALLS]
    assert max(watched.writes) > PAGE
