"""Two daemons' stores on one database racing prepare-and-start on the same
call: exactly one EXECUTE per round. Each round, both write functions read
the absent record before either writes (a rendezvous inside the view), the
worst interleaving there is. The negative control is the same store without
its isolation (READ COMMITTED): both see the call absent, both start it, and
the same check catches the second EXECUTE."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import psycopg

from sidecar.clock import ManualClock
from sidecar.ledger.model import Decision, Effect
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.validation import Limits
from sidecar.services.ledger import LedgerService
from sidecar.storage import calls
from sidecar.storage.api import CallWrite, ReadView, Table, WriteView
from sidecar.storage.postgres.store import PostgresOptions, PostgresStore
from tests.services.support import spec

T = TypeVar("T")
ROUNDS = 20


class LooseStore(PostgresStore):
    """The negative control: no serializable isolation."""

    isolation = psycopg.IsolationLevel.READ_COMMITTED


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


class _MeetingView:
    def __init__(self, view: WriteView, rendezvous: Rendezvous) -> None:
        self._view = view
        self.summarize = view.summarize
        self._rendezvous = rendezvous

    def get(self, table: Table, key: bytes) -> bytes | None:
        found = self._view.get(table, key)
        if table is Table.CALLS:
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
    """A `Store` whose write functions meet at the current rendezvous."""

    def __init__(self, inner: PostgresStore) -> None:
        self.inner = inner
        self.rendezvous = Rendezvous()

    @property
    def incarnation(self) -> int:
        return self.inner.incarnation

    @property
    def exclusive(self) -> bool:
        return self.inner.exclusive

    @property
    def reads_wait(self) -> bool:
        return self.inner.reads_wait

    def read(self, fn: Callable[[ReadView], T]) -> T:
        return self.inner.read(fn)

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        rendezvous = self.rendezvous
        return self.inner.submit(lambda view: fn(_MeetingView(view, rendezvous)))

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        rendezvous = self.rendezvous
        return await self.inner.write(lambda view: fn(_MeetingView(view, rendezvous)))

    async def save_call(self, write: CallWrite) -> None:
        await self.write(functools.partial(calls.compare_and_save, write=write))

    def close(self) -> None:
        self.inner.close()

    def backup(self, path: Path) -> int:
        return self.inner.backup(path)


def _race(url: str, store_class: type[PostgresStore]) -> list[int]:
    """EXECUTEs per round of two daemons' ledgers racing on one call."""
    options = PostgresOptions(writers=1, readers=1)
    stores = [Racing(store_class(url, options)) for _ in range(2)]
    # Without quotas no usage row is read: the call record is what they race on.
    ledgers = [
        LedgerService(s, ManualClock(), Limits(), FixedPolicy(), quotas=Quotas(0, 0))
        for s in stores
    ]
    executes = []
    try:
        for round_ in range(ROUNDS):
            rendezvous = Rendezvous()
            for s in stores:
                s.rendezvous = rendezvous
            asked = spec(f"call-{round_}", Effect.SIDE_EFFECT, start=True)
            answers: list[Decision] = []

            def prepare(ledger: LedgerService) -> None:
                answers.append(asyncio.run(ledger.prepare(asked)).decision)  # noqa: B023

            threads = [
                threading.Thread(target=prepare, args=(ledger,)) for ledger in ledgers
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert len(answers) == 2
            executes.append(answers.count(Decision.EXECUTE))
    finally:
        for s in stores:
            s.close()
    return executes


def test_two_daemons_racing_on_one_call_execute_it_once(pg_url: str) -> None:
    """Every round: one EXECUTE, the other daemon IN_PROGRESS or RECONCILE."""
    assert _race(pg_url, PostgresStore) == [1] * ROUNDS


def test_without_isolation_the_race_executes_twice(pg_url: str) -> None:
    """The negative control: READ COMMITTED lets both start the call."""
    executes = _race(pg_url, LooseStore)
    assert max(executes) == 2, executes
