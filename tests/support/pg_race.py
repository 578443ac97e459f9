"""Two daemons' stores on one database, their write functions meeting right
after a read (`Racing`): both have read before either writes, the worst
interleaving there is for a compare-and-swap."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from sidecar.storage import calls
from sidecar.storage.api import CallWrite, ReadView, Table, WriteView
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.table_ledger import TableLedger

T = TypeVar("T")


class Rendezvous:
    """The first two write functions to read a call record wait for each
    other there (at most `timeout` seconds); later reads pass."""

    def __init__(self, timeout: float = 3.0) -> None:
        self._barrier = threading.Barrier(2, timeout=timeout)
        self._lock = threading.Lock()
        self._arrived = 0

    def meet(self) -> None:
        with self._lock:
            self._arrived += 1
            waits = self._arrived <= 2
        if waits:
            # Broken: the other one never came, no race this round.
            with contextlib.suppress(threading.BrokenBarrierError):
                self._barrier.wait()


class _MeetingView(TableLedger):
    def __init__(self, view: WriteView, rendezvous: Rendezvous, table: Table) -> None:
        self._view = view
        self.summarize = view.summarize
        self._rendezvous = rendezvous
        self._table = table

    def get(self, table: Table, key: bytes) -> bytes | None:
        found = self._view.get(table, key)
        if table is self._table:
            self._rendezvous.meet()
        return found

    def scan(
        self, table: Table, prefix: bytes, *, after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self._view.scan(table, prefix, after=after)

    def put(self, table: Table, key: bytes, value: bytes) -> None:
        self._view.put(table, key, value)

    def delete(self, table: Table, key: bytes) -> None:
        self._view.delete(table, key)


class Racing:
    """A `Store` whose write functions meet at the current rendezvous, right
    after their first read of `table` (a call record by default)."""

    def __init__(self, inner: PostgresStore, table: Table = Table.CALLS) -> None:
        self.inner = inner
        self.rendezvous = Rendezvous()
        self.table = table

    @property
    def incarnation(self) -> int:
        return self.inner.incarnation

    @property
    def exclusive(self) -> bool:
        return self.inner.exclusive

    @property
    def reads_wait(self) -> bool:
        return self.inner.reads_wait

    @property
    def saves_by_statement(self) -> bool:
        return self.inner.saves_by_statement

    def read(self, fn: Callable[[ReadView], T]) -> T:
        return self.inner.read(fn)

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        meeting, table = self.rendezvous, self.table
        return self.inner.submit(lambda view: fn(_MeetingView(view, meeting, table)))

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        meeting, table = self.rendezvous, self.table
        return await self.inner.write(
            lambda view: fn(_MeetingView(view, meeting, table))
        )

    async def save_call(self, write: CallWrite) -> None:
        await self.write(functools.partial(calls.compare_and_save, write=write))

    def close(self) -> None:
        self.inner.close()

    def backup(self, path: Path) -> int:
        return self.inner.backup(path)
