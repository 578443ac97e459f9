"""A call's save as one statement on PostgreSQL (`storage.postgres.call_saves`):
the row's columns, the counters, the quota across writers, a batch of
saves in one transaction, and a statement whose answer the connection lost.

Each property has its negative control: a statement that counts a replaced
record's whole size, a quota that does not look again at the lock row it
waited for, and a lost statement settled without ending its backend, each
caught."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, LiteralString

import psycopg
import pytest

from sidecar.errors import QuotaExceeded, StorageUnavailable
from sidecar.ledger.model import CallRef, Outcome, Result, State, ToolCall
from sidecar.ledger.quota import Quotas, Usage
from sidecar.rpc import summaries
from sidecar.storage import keys, records, usage
from sidecar.storage.api import CallWrite, Conflict
from sidecar.storage.call_documents import encode_call
from sidecar.storage.plan_rows import encode as plan_row
from sidecar.storage.postgres import call_saves, call_statements, tables
from sidecar.storage.postgres import store as store_module
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.postgres.views import Params
from tests.storage.random_calls import random_call
from tests.support import postgres

OPTIONS = PostgresOptions(summarize=summaries.summarize)


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url, OPTIONS)
    try:
        yield s
    finally:
        s.close()


def _new(call_id: str, *, namespace: str = "default", rev: int = 1) -> ToolCall:
    rng = random.Random(call_id)  # noqa: S311 - test records
    call = random_call(rng, call_id, state=State.PREPARED)
    return dataclasses.replace(
        call, ref=CallRef(namespace, "run", call_id), revision=rev, lease=None
    )


def _committed(call: ToolCall, payload_size: int) -> ToolCall:
    digest = "sha256:" + "ab" * 32
    result = Result(Outcome.OK, None, "", "x" * payload_size, digest)
    return dataclasses.replace(
        call, state=State.COMMITTED, revision=call.revision + 1, result=result
    )


def _save(store: PostgresStore, write: CallWrite) -> None:
    asyncio.run(store.save_call(write))


def test_a_records_columns_are_those_its_document_gives() -> None:
    seed = random.randrange(1 << 32)  # noqa: S311 - a test seed
    print("seed", seed)
    rng = random.Random(seed)  # noqa: S311 - test records
    for i in range(300):
        call = random_call(rng, f"c{i}")
        key = keys.call_key(call.ref)
        doc = encode_call(call)
        plan = plan_row(call, summaries.summarize)
        assert call_saves.columns(key, call, doc, plan) == tables.columns(
            key, doc, plan, None
        )


# The counters of every writer's shard folded into one no writer uses: a
# save then finds no shard row of its own and makes one.
_FOLDED = (
    "WITH d AS (DELETE FROM effectd_usage WHERE shard >= 0 AND shard <> 64 "
    "RETURNING namespace, open_calls, stored_bytes, tombstone_bytes) "
    "INSERT INTO effectd_usage AS u (namespace, shard, open_calls, "
    "stored_bytes, tombstone_bytes) SELECT namespace, 64, sum(open_calls), "
    "sum(stored_bytes), sum(tombstone_bytes) FROM d GROUP BY namespace "
    "ON CONFLICT (namespace, shard) DO UPDATE SET "
    "open_calls = u.open_calls + EXCLUDED.open_calls, "
    "stored_bytes = u.stored_bytes + EXCLUDED.stored_bytes, "
    "tombstone_bytes = u.tombstone_bytes + EXCLUDED.tombstone_bytes"
)


def _counted(
    store: PostgresStore, quotas: Quotas | None, *, folded: str | None = None
) -> tuple[Any, Any]:
    """Saves new calls and commits of them, each alone; the counters as
    stored and as counted from the records. With `folded` (a database
    URL), the shard rows are folded away before each commit."""
    rng = random.Random(7)  # noqa: S311 - test sizes
    for i in range(12):
        call = _new(f"c{i}", namespace=f"ns{i % 3}")
        _save(store, CallWrite(None, call, quotas))
        if i % 4:
            if folded is not None:
                with psycopg.connect(folded, autocommit=True) as conn:
                    conn.execute(_FOLDED)
            _save(store, CallWrite(call, _committed(call, rng.randrange(400))))
    return store.read(usage.stored), store.read(usage.recount)


@pytest.mark.parametrize("folded", [False, True], ids=["own-row", "no-row"])
@pytest.mark.parametrize("quotas", [None, Quotas()], ids=["no-quota", "quota"])
def test_counters_follow_the_saves(
    store: PostgresStore, pg_url: str, quotas: Quotas | None, folded: bool
) -> None:
    """Exact, whether a save finds its shard row or makes it."""
    before = store.stats.transactions
    stored, counted = _counted(store, quotas, folded=pg_url if folded else None)
    assert stored == counted
    assert store.stats.transactions - before == 12 + 9


def test_a_replaced_record_counted_whole_is_caught(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the change of stored bytes taken as the new
    document's length, not its difference from the replaced one's."""
    whole: LiteralString = call_statements.REPLACE_CALL.replace(
        "%(size)s::bigint - c.was", "%(size)s::bigint + 0 * c.was"
    )
    assert whole != call_statements.REPLACE_CALL
    monkeypatch.setattr(call_saves, "REPLACE_CALL", whole)
    stored, counted = _counted(store, None)
    assert stored != counted


@pytest.mark.parametrize("statement", ["NEW_CALL", "REPLACE_CALL"])
def test_a_shard_row_never_inserted_is_caught(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch, statement: str
) -> None:
    """Negative control: the counters' change only by their UPDATE, so a
    shard row that does not exist yet is never made."""
    query: LiteralString = getattr(call_saves, statement)
    dropped = query.replace("AND NOT EXISTS (SELECT 1 FROM s)", "AND false")
    assert dropped != query
    monkeypatch.setattr(call_saves, statement, dropped)
    stored, counted = _counted(store, None, folded=pg_url)
    assert stored != counted


# -- the quota across writers ---------------------------------------------------


def _lock_row_held(pg_url: str, namespace: str, ready: threading.Event,
                   release: threading.Event) -> None:  # fmt: skip
    """Another writer's quota check in flight: the namespace's lock row
    grown by one open call, uncommitted until `release`."""
    with psycopg.connect(pg_url) as conn:
        conn.execute(
            "UPDATE effectd_usage SET open_calls = open_calls + 1 "
            "WHERE namespace = %s AND shard = -1",
            (namespace.encode(),),
        )
        ready.set()
        release.wait(10)
        conn.commit()


def _past_a_check_in_flight(store: PostgresStore, pg_url: str) -> BaseException | None:
    """A namespace one call short of its open-calls limit, another writer's
    check taking that call in flight, and a new call saved meanwhile: what
    its save raised (None: saved)."""
    quotas = Quotas(open_calls=3, stored_bytes=0)
    for i in range(2):
        _save(store, CallWrite(None, _new(f"before{i}"), quotas))
    ready, release = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=_lock_row_held, args=(pg_url, "default", ready, release)
    )
    holder.start()
    assert ready.wait(10)
    threading.Timer(0.3, release.set).start()
    try:
        _save(store, CallWrite(None, _new("racing"), quotas))
    except (QuotaExceeded, Conflict) as refused:
        return refused
    finally:
        release.set()
        holder.join()
    return None


def test_a_quota_check_waits_for_the_one_in_flight(
    store: PostgresStore, pg_url: str
) -> None:
    refused = _past_a_check_in_flight(store, pg_url)
    assert isinstance(refused, QuotaExceeded)
    assert store.read(lambda v: usage.load(v, "default")).open_calls == 3


def test_a_quota_check_on_the_snapshot_alone_is_caught(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the lock row's condition not looked at again once
    the statement waited for it."""
    condition = "OR u.open_calls + (SELECT open_other FROM o) + %(open)s <= %(lo)s)"
    assert condition in call_statements.WITHIN_ROW
    blind: LiteralString = call_statements.NEW_CALL_WITHIN_QUOTA.replace(
        condition, "OR true)"
    )
    monkeypatch.setattr(call_saves, "NEW_CALL_WITHIN_QUOTA", blind)
    assert _past_a_check_in_flight(store, pg_url) is None


# -- a batch of saves -----------------------------------------------------------


def test_a_batch_of_saves_is_one_transaction_each_refused_alone(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saves queued behind a busy writer commit together, as statements (the
    batch of saves alone, `_saved`); a lost compare and a quota's refusal
    fail only their own request."""
    batches: list[int] = []
    saved = PostgresStore._saved

    def counted(self: PostgresStore, conn: Any, batch: Any, saves: Any) -> Any:
        batches.append(len(batch))
        return saved(self, conn, batch, saves)

    monkeypatch.setattr(PostgresStore, "_saved", counted)
    quotas = Quotas(open_calls=2, stored_bytes=0)
    taken, release = threading.Event(), threading.Event()

    def busy(_view: object) -> None:
        taken.set()
        release.wait(10)

    async def run() -> list[BaseException | None]:
        blocker = store.submit(busy)
        assert await asyncio.to_thread(taken.wait, 10)
        first = _new("a")
        saves = [
            asyncio.ensure_future(store.save_call(CallWrite(None, first, quotas))),
            asyncio.ensure_future(store.save_call(CallWrite(None, first, quotas))),
            asyncio.ensure_future(store.save_call(CallWrite(None, _new("b"), quotas))),
            asyncio.ensure_future(store.save_call(CallWrite(None, _new("c"), quotas))),
        ]
        await asyncio.sleep(0.2)
        before = store.stats.transactions
        release.set()
        await asyncio.wrap_future(blocker)
        outcomes = await asyncio.gather(*saves, return_exceptions=True)
        assert store.stats.transactions - before == 2  # the blocker, the saves
        return [o if isinstance(o, BaseException) else None for o in outcomes]

    outcomes = asyncio.run(run())
    assert batches == [4]
    assert outcomes[0] is None
    assert outcomes[2] is None
    assert isinstance(outcomes[1], Conflict)
    assert isinstance(outcomes[3], QuotaExceeded)
    assert store.read(usage.stored) == store.read(usage.recount)


# -- a statement whose answer was lost ---------------------------------------------

_Run = Callable[[LiteralString, Params], "tuple[object, ...] | None"]


def _lost_answers(
    monkeypatch: pytest.MonkeyPatch, *, ran: bool, times: int = 1
) -> None:
    """The next `times` saves' statements lose their connection: after they
    ran (`ran`), or before they were sent."""
    made = store_module._first_row
    left = [times]

    def first_row(conn: Any, opening: Any = None) -> _Run:
        run = made(conn, opening)

        def lost(query: LiteralString, params: Params) -> Any:
            if left[0] <= 0 or opening is not None:
                return run(query, params)
            left[0] -= 1
            if ran:
                run(query, params)
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        return lost

    monkeypatch.setattr(store_module, "_first_row", first_row)


def test_a_save_whose_answer_was_lost_is_found_committed(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lost_answers(monkeypatch, ran=True)
    call = _new("lost")
    _save(store, CallWrite(None, call))
    assert store.read(lambda v: records.load_call(v, call.ref)) == call
    assert store.stats.commits_resolved == 1


def test_a_save_lost_before_it_ran_is_decided_again(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lost_answers(monkeypatch, ran=False)
    call = _new("never")
    with pytest.raises(Conflict):
        _save(store, CallWrite(None, call))
    assert store.read(lambda v: records.load_call(v, call.ref)) is None
    _save(store, CallWrite(None, call))
    assert store.read(lambda v: records.load_call(v, call.ref)) == call


def _stuck_then_lost(
    store: PostgresStore, pg_url: str
) -> tuple[Any, ToolCall, ToolCall]:
    """A commit's statement waiting for the call's row (another transaction
    holds it), its client connection lost meanwhile; that transaction ends
    once the store answered. What the save raised, the record it compared,
    and the record stored after all that."""
    call = _new("stuck")
    _save(store, CallWrite(None, call))
    made = store_module._first_row

    def first_row(conn: Any, opening: Any = None) -> _Run:
        fd = os.dup(conn.pgconn.socket)

        def cut() -> None:
            with socket.socket(fileno=fd) as sock:
                sock.shutdown(socket.SHUT_RDWR)

        threading.Timer(0.3, cut).start()
        return made(conn, opening)

    key = keys.call_key(call.ref)
    with psycopg.connect(pg_url) as holder:
        holder.execute("SELECT 1 FROM effectd_calls WHERE k = %s FOR UPDATE", (key,))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store_module, "_first_row", first_row)
            try:
                _save(store, CallWrite(call, _committed(call, 10)))
                raised: Any = None
            except Exception as exc:  # what the store answered
                raised = exc
        holder.commit()
    time.sleep(0.3)  # a statement still alive would now apply
    stored = store.read(lambda v: records.load_call(v, call.ref))
    assert stored is not None
    return raised, call, stored


def test_a_lost_statement_is_ended_before_it_is_judged(
    store: PostgresStore, pg_url: str
) -> None:
    raised, compared, stored = _stuck_then_lost(store, pg_url)
    assert isinstance(raised, Conflict)
    assert stored == compared


def test_a_lost_statement_judged_while_alive_is_caught(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the backend of the lost statement taken for gone:
    answered "not applied", it applies after the answer."""
    monkeypatch.setattr(call_saves, "_gone", lambda conn, backend: True)
    raised, compared, stored = _stuck_then_lost(store, pg_url)
    assert isinstance(raised, Conflict)
    assert stored != compared
    assert stored.state is State.COMMITTED


def test_counters_after_lost_answers_stay_exact(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lost_answers(monkeypatch, ran=True, times=3)
    for i in range(3):
        call = _new(f"n{i}")
        _save(store, CallWrite(None, call, Quotas()))
    assert store.read(usage.stored) == store.read(usage.recount)
    assert store.read(lambda v: usage.load(v, "default")) == Usage(
        3, store.read(usage.recount)["default"].stored_bytes, 0
    )


def _lost_with_the_idle_reads(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> BaseException | None:
    """A save's statement lost before it ran, when whatever broke its
    connection broke the read pool's idle ones too: what the save raised."""
    _lost_answers(monkeypatch, ran=False)
    assert postgres.terminate("effectd/reads", pg_url) >= 1
    try:
        _save(store, CallWrite(None, _new("after-a-restart")))
    except Exception as exc:  # what the store answered
        return exc
    return None


def test_a_lost_save_is_settled_past_a_broken_read_connection(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(_lost_with_the_idle_reads(store, pg_url, monkeypatch), Conflict)


def test_a_settle_asked_once_is_caught(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: asked on one read connection only, the broken one
    leaves the outcome unknown, though nothing was applied."""
    monkeypatch.setattr(store_module, "_SETTLE_ASKS", 1)
    raised = _lost_with_the_idle_reads(store, pg_url, monkeypatch)
    assert isinstance(raised, StorageUnavailable)
    assert raised.metadata == {"mayHaveBeenApplied": "true"}
