"""What a first execution costs on the wire to PostgreSQL, counted from the
protocol itself (libpq's trace of every connection of the store): a round
trip is a run of messages the daemon sends, ended by the server's answer.

A first execution (PrepareTool with start, then CommitTool, a quota on) is
2 round trips and 2 commits, each save one statement committed on its own
(`storage.postgres.call_saves`):

- PrepareTool, decided as a new call with no read (`services.recent_calls.made`):
  the new call's row inserted, and its growth added to the namespace's
  lock row within the quota, in one statement whose insert is the compare
  (1).
- CommitTool, decided on the record PrepareTool saved (`services.recent_calls`),
  with no read: its compare-and-swap, an UPDATE on that record's revision,
  with the change of the counters (1).

Each cut is caught when it is undone (the negative controls): PrepareTool
decided on a read, CommitTool decided on a read, or in a write transaction,
or each save a transaction of its own through the key-value views (as
before the saves were statements). The
second is the path a batch of more than saves takes, whose own cuts are
held too: a new call's row read again in its transaction adds a round
trip, each BEGIN sent on its own two. A batch of saves alone is one
transaction of their statements. Only the services and the store run: no
background pass of a daemon sends a statement between the counts."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import LiteralString

import psycopg
import pytest

from sidecar.clock import ManualClock
from sidecar.ledger.model import CallRef, Outcome, Result, State, ToolCall
from sidecar.ledger.policy import FixedPolicy, Policy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import Answer, Now, Step
from sidecar.ledger.validation import Limits
from sidecar.services._common import in_write
from sidecar.services.ledger import LedgerService
from sidecar.services.recent_calls import RecentCalls
from sidecar.storage.api import Table
from sidecar.storage.postgres import call_saves
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.postgres.views import PgReadView, PgWriteView, StoreConnection
from tests.services.support import spec

_Conn = StoreConnection
# Runs enough for psycopg to have prepared every statement of the path
# (after five runs): preparing one takes a round trip of its own.
WARM = 8


class TracedStore(PostgresStore):
    """The PostgreSQL store, every connection it opens traced by libpq."""

    def __init__(self, url: str, traces: Path) -> None:
        self._traces = traces
        # Each connection, the descriptor its trace is written to, its file.
        self.traced: list[tuple[_Conn, int, Path]] = []
        self._wire: dict[int, _Wire] = {}
        super().__init__(url, PostgresOptions(writers=1, readers=1))

    def _trace(self, conn: _Conn) -> None:
        path = self._traces / f"{len(self.traced)}.trace"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        self.traced.append((conn, fd, path))

    def _configure_writer(self, conn: _Conn) -> None:
        super()._configure_writer(conn)
        self._trace(conn)

    def statements_off(self) -> None:
        """Every save a write transaction through the views, as behind a
        transaction pooler."""
        self._direct = False

    def _configure_points(self, conn: _Conn) -> None:
        super()._configure_points(conn)
        self._trace(conn)

    def _configure_reader(self, conn: _Conn) -> None:
        super()._configure_reader(conn)
        self._trace(conn)

    def round_trips(self) -> tuple[int, int]:
        """The round trips and commits of every connection since the last
        count: each trace flushed (libpq writes it through a buffer), read,
        emptied and started again."""
        trips = commits = 0
        for conn, fd, path in self.traced:
            conn.pgconn.untrace()
            text = path.read_text()
            os.ftruncate(fd, 0)
            counted = self._wire.setdefault(id(conn), _Wire()).count(text)
            trips += counted[0]
            commits += counted[1]
            conn.pgconn.trace(fd)
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        return trips, commits


_WRITES = ("INSERT INTO", "UPDATE effectd", "DELETE FROM")


class _Wire:
    """One connection's trace, read message by message: a round trip is a
    run of messages sent, ended by the server's answer; a commit is a
    COMMIT, or a statement that writes sent outside a transaction (in
    autocommit: committed on its own). Statements prepared by name are
    known by the text they were prepared with."""

    def __init__(self) -> None:
        self.prepared: dict[str, str] = {}
        self.idle = True
        self.begun = False

    def _commits(self, statement: str) -> int:
        """The commits `statement`, sent now, makes."""
        if statement.startswith("BEGIN"):
            self.begun = True
            return 0
        if statement == "COMMIT":
            return 1
        outside = self.idle and not self.begun
        return int(outside and any(w in statement for w in _WRITES))

    def count(self, text: str) -> tuple[int, int]:
        trips = commits = 0
        sent = False
        for line in text.splitlines():
            direction, _, message = line.partition("\t")
            kind = message.split("\t")[1] if message.count("\t") >= 1 else ""
            quoted = message.split('"')
            if direction == "F":
                sent = True
                statement = None
                if kind == "Parse":
                    self.prepared[quoted[1]] = quoted[3]
                elif kind == "Bind":
                    statement = self.prepared.get(quoted[3], "")
                elif kind == "Query":
                    statement = quoted[1]
                if statement is not None:
                    commits += self._commits(statement)
            elif direction == "B":
                if sent:
                    trips += 1
                    sent = False
                if kind == "ReadyForQuery":
                    self.idle = message.endswith("I")
                    if self.idle:
                        self.begun = False
        return trips, commits


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    return tmp_path


def _first_execution(ledger: LedgerService, call_id: str) -> None:
    async def run() -> None:
        started = await ledger.prepare(spec(call_id))
        attempt = started.call.attempt
        result = Result(Outcome.OK, None, "", "", "digest")
        await ledger.commit(
            started.call.ref,
            attempt=attempt,
            result=result,
            expected_revision=None,
            acknowledge=True,
        )

    asyncio.run(run())


@pytest.fixture
def ledger_on(pg_url: str, traces: Path) -> Iterator[tuple[TracedStore, LedgerService]]:
    store = TracedStore(pg_url, traces)
    quotas = Quotas(open_calls=1_000, stored_bytes=1 << 30)
    ledger = LedgerService(store, ManualClock(), Limits(), FixedPolicy(), quotas=quotas)
    try:
        yield store, ledger
    finally:
        store.close()


def _phases(store: TracedStore, ledger: LedgerService) -> tuple[int, int]:
    for i in range(WARM):
        _first_execution(ledger, f"warm-{i}")
    store.round_trips()
    _first_execution(ledger, "measured")
    return store.round_trips()


def test_a_first_execution_is_two_round_trips_and_two_commits(
    ledger_on: tuple[TracedStore, LedgerService],
) -> None:
    store, ledger = ledger_on
    assert _phases(store, ledger) == (2, 2)


def test_a_new_call_decided_on_a_read_is_caught(
    ledger_on: tuple[TracedStore, LedgerService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: PrepareTool decided on a point read that finds no
    call, as for a call the daemon knows stored."""
    store, ledger = ledger_on
    monkeypatch.setattr(RecentCalls, "is_known", lambda self, ref: True)
    assert _phases(store, ledger) == (3, 2)


def test_a_commit_decided_on_a_read_is_caught(
    ledger_on: tuple[TracedStore, LedgerService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: no record remembered, CommitTool decided on a
    point read of the call first."""
    store, ledger = ledger_on
    monkeypatch.setattr(RecentCalls, "get", lambda self, ref: None)
    assert _phases(store, ledger) == (3, 2)


def test_a_commit_decided_in_its_write_transaction_is_caught(
    ledger_on: tuple[TracedStore, LedgerService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: CommitTool decided in a write transaction, on the
    row it locks: BEGIN with that read, the writes, COMMIT."""
    store, ledger = ledger_on

    async def in_its_write(
        self: LedgerService,
        ref: CallRef,
        rule: Callable[[ToolCall, Now, Policy], Step],
    ) -> Answer:
        return await in_write(store, self._mutation(ref, rule))

    monkeypatch.setattr(LedgerService, "_changed", in_its_write)
    assert _phases(store, ledger) == (4, 2)


def test_saves_in_transactions_of_their_own_are_caught(
    ledger_on: tuple[TracedStore, LedgerService],
) -> None:
    """Negative control: every save a write transaction through the views
    (the path of a batch that holds more than saves), CommitTool then
    decided in it: PrepareTool's read, BEGIN with the quota check, the
    writes, COMMIT; CommitTool's BEGIN with its locked read, the writes,
    COMMIT."""
    store, ledger = ledger_on
    store.statements_off()
    assert _phases(store, ledger) == (7, 2)


def test_a_new_call_read_again_in_its_write_is_caught(
    ledger_on: tuple[TracedStore, LedgerService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control, in a transaction through the views: the new call's
    row read again (`FOR UPDATE`) in the write transaction that inserts it."""
    store, ledger = ledger_on
    store.statements_off()
    monkeypatch.setattr(PgWriteView, "assume_absent", lambda self, k: None)
    assert _phases(store, ledger) == (8, 2)


def test_a_begin_sent_on_its_own_is_caught(
    ledger_on: tuple[TracedStore, LedgerService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control, in a transaction through the views: what opens a
    write transaction sent before its first statement, as a round trip of
    its own."""
    store, ledger = ledger_on
    store.statements_off()

    def on_its_own(
        self: PgReadView, query: LiteralString, params: tuple[object, ...]
    ) -> psycopg.Cursor[tuple[object, ...]]:
        opening = self._opening
        for statement, values in opening or ():
            self._conn.execute(statement, values)
        if opening:
            opening.clear()
        return self._conn.execute(query, params)

    monkeypatch.setattr(PgReadView, "_cursor", on_its_own)
    assert _phases(store, ledger) == (9, 2)


def test_a_snapshot_read_is_two_round_trips(
    ledger_on: tuple[TracedStore, LedgerService],
) -> None:
    """A read on a snapshot of its own: BEGIN with its first statement (1),
    ROLLBACK (1)."""
    store, _ = ledger_on
    for _ in range(WARM):
        store.read(lambda view: view.get(Table.META, b"absent"))
    store.round_trips()
    assert store.read(lambda view: view.get(Table.META, b"absent")) is None
    assert store.round_trips() == (2, 0)


def _repeats(store: TracedStore, ledger: LedgerService) -> tuple[int, int]:
    """A PrepareTool of a call committed by another daemon's ledger (one on
    the same store that never saw it), after warming up on others."""
    quotas = Quotas(open_calls=1_000, stored_bytes=1 << 30)
    other = LedgerService(store, ManualClock(), Limits(), FixedPolicy(), quotas=quotas)
    for i in range(WARM + 1):
        _first_execution(ledger, f"made-{i}")
    for i in range(WARM):
        asyncio.run(other.prepare(spec(f"made-{i}")))
    store.round_trips()
    answer = asyncio.run(other.prepare(spec(f"made-{WARM}")))
    assert answer.call.state is State.COMMITTED
    return store.round_trips()


def test_a_repeat_of_a_call_the_daemon_never_saw_is_one_round_trip(
    ledger_on: tuple[TracedStore, LedgerService],
) -> None:
    """Tried as a new call: the insert that loses brings back the row that
    made it lose, and the repeat is answered from it, with no read after.
    The lost insert is a statement in autocommit, which the trace counts as
    a commit: one that wrote no row."""
    store, ledger = ledger_on
    assert _repeats(store, ledger) == (1, 1)


def test_a_repeat_read_after_its_lost_insert_is_caught(
    ledger_on: tuple[TracedStore, LedgerService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the row the lost insert found not taken: the
    repeat is read again."""
    store, ledger = ledger_on
    monkeypatch.setattr(call_saves, "_readable", lambda doc, tomb: None)
    assert _repeats(store, ledger) == (2, 1)
