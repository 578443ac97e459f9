"""A call's next step decided on the record this daemon saved last
(`services.recent_calls.RecentCalls`), on the shared store, where a read is a
round trip: the same answers as on a read when another daemon changed the
record in between.

Two daemons share one database (two stores, two ledgers); a third ledger,
with no remembered records, answers the same sequence on another call: the
answer a read gives. The negative control answers a step that changes
nothing from the remembered record, as a read would not: it tells the
caller the call is in progress when it is not."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import EffectdError
from sidecar.ledger import retention
from sidecar.ledger.model import (
    CallRef,
    Outcome,
    Payload,
    PayloadKind,
    Result,
    State,
    ToolCall,
)
from sidecar.ledger.policy import FixedPolicy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import Answer
from sidecar.ledger.validation import Limits
from sidecar.services import ledger as ledger_module
from sidecar.services._common import Decided
from sidecar.services.ledger import LedgerService
from sidecar.services.recent_calls import RecentCalls
from sidecar.storage.api import Conflict, LedgerReads, ReadView, Store
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.table_ledger import NO_READS, absent
from tests.services.support import spec
from tests.storage.random_calls import random_call

T = TypeVar("T")
Outcome_ = tuple[str, State | None]


def run(step: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(step)


@pytest.fixture
def daemons(pg_url: str) -> Iterator[tuple[LedgerService, LedgerService]]:
    """Two daemons' ledgers on one database, sharing one clock."""
    clock = ManualClock()
    stores = [PostgresStore(pg_url, PostgresOptions()) for _ in range(2)]
    try:
        yield (
            LedgerService(stores[0], clock, Limits(), FixedPolicy()),
            LedgerService(stores[1], clock, Limits(), FixedPolicy()),
        )
    finally:
        for store in stores:
            store.close()


def _outcome(step: Callable[[], Answer]) -> Outcome_:
    """What a step answered: its decision and the state it shows, or the
    reason of its refusal."""
    try:
        answer = step()
    except EffectdError as refused:
        return refused.reason, None
    return answer.decision.name, answer.call.state


def _after_unknown(
    here: LedgerService,
    there: LedgerService,
    call_id: str,
    step: Callable[[LedgerService, CallRef], Answer],
) -> tuple[Outcome_, ToolCall]:
    """`here` starts a call, `there` reports its attempt's outcome unknown,
    then `here` takes `step`: what it answered, and the record stored."""
    started = run(here.prepare(spec(call_id)))
    ref = started.call.ref
    run(there.report_unknown(ref, attempt=1, reason="the worker was lost"))
    answered = _outcome(lambda: step(here, ref))
    return answered, run(there.get(ref))


def _commit(ledger: LedgerService, ref: CallRef) -> Answer:
    result = Result(Outcome.OK, None, "", "", "sha256:" + "ab" * 32)
    return run(ledger.commit(ref, attempt=1, result=result, expected_revision=None))


def _start(ledger: LedgerService, ref: CallRef) -> Answer:
    return run(ledger.start(ref, lease_ms=0, retry=False, expected_revision=None))


@pytest.mark.parametrize("step", [_commit, _start], ids=["commit", "start"])
def test_a_remembered_record_changed_elsewhere_answers_as_a_read(
    daemons: tuple[LedgerService, LedgerService],
    step: Callable[[LedgerService, CallRef], Answer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = daemons
    remembered, stored = _after_unknown(a, b, "remembered", step)
    with monkeypatch.context() as reading:
        reading.setattr(RecentCalls, "get", lambda self, ref: None)
        read, read_stored = _after_unknown(a, b, "read", step)
    assert remembered == read
    assert (stored.state, stored.revision) == (read_stored.state, read_stored.revision)
    assert any(t.to_state is State.UNKNOWN for t in stored.history)


def test_a_step_that_changes_nothing_answered_from_memory_is_caught(
    daemons: tuple[LedgerService, LedgerService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a step on the remembered record that changes
    nothing answered from it: the start of a call another daemon found lost
    answers IN_PROGRESS, where a read refuses it."""
    a, b = daemons

    async def from_memory(
        store: Store,
        recent: RecentCalls,
        ref: CallRef,
        decide: Callable[[ToolCall, ReadView], Decided],
    ) -> Answer | None:
        old = recent.get(ref)
        if old is None:
            return None
        decision = decide(old, NO_READS)
        if decision.write is not None or isinstance(decision.reply, EffectdError):
            return None
        return decision.reply

    with monkeypatch.context() as reading:
        reading.setattr(RecentCalls, "get", lambda self, ref: None)
        read, _ = _after_unknown(a, b, "read", _start)
    monkeypatch.setattr(ledger_module, "stepped", from_memory)
    remembered, _ = _after_unknown(a, b, "remembered", _start)
    assert remembered != read
    assert remembered == ("IN_PROGRESS", State.STARTED)


def test_the_remembered_records_are_bounded() -> None:
    recent = RecentCalls(2)
    rng = random.Random(1)  # noqa: S311 - test records
    calls = [random_call(rng, f"c{i}", state=State.STARTED) for i in range(3)]
    for call in calls:
        recent.remember(call)
    assert len(recent) == 2
    assert recent.get(calls[0].ref) is None
    assert recent.get(calls[2].ref) is calls[2]


def _holding(call_id: str, payload: int) -> ToolCall:
    rng = random.Random(call_id)  # noqa: S311 - test records
    call = random_call(rng, call_id, state=State.STARTED)
    return dataclasses.replace(
        call, kept_input=Payload(PayloadKind.RAW, b"x" * payload), result=None
    )


def test_the_remembered_records_are_bounded_by_their_payloads() -> None:
    """Inputs and results of up to a MiB each: the records held stay within
    the byte budget, whatever their number; one heavier than it is not held."""
    recent = RecentCalls(size=100, budget=5000)
    calls = [_holding(f"c{i}", 1000) for i in range(3)]
    for call in calls:
        recent.remember(call)
    assert len(recent) == 2
    assert recent.held_bytes <= 5000
    assert recent.get(calls[0].ref) is None
    heavy = _holding("heavy", 6000)
    recent.remember(heavy)
    assert recent.get(heavy.ref) is None
    assert recent.held_bytes <= 5000


def test_a_committed_record_is_not_remembered() -> None:
    """A call's steps end with its commit: its record, result and all, is
    let go, and the one remembered before it with it."""
    recent = RecentCalls()
    started = _holding("c", 1000)
    recent.remember(started)
    committed = dataclasses.replace(
        started,
        state=State.COMMITTED,
        revision=started.revision + 1,
        result=Result(Outcome.OK, Payload(PayloadKind.RAW, b"r" * 1000), "", "", "d"),
    )
    recent.remember(committed)
    assert recent.get(started.ref) is None
    assert (len(recent), recent.held_bytes) == (0, 0)


# -- a new call saved with no read before it (`recent_calls.made`) ---------------


@pytest.fixture
def at_quota(pg_url: str) -> Iterator[tuple[LedgerService, LedgerService, Store]]:
    """Two daemons' ledgers on one database, under a quota of two open
    calls, and the first one's store."""
    clock = ManualClock()
    quotas = Quotas(open_calls=2, stored_bytes=0)
    stores = [PostgresStore(pg_url, PostgresOptions()) for _ in range(2)]
    try:
        a, b = (
            LedgerService(s, clock, Limits(), FixedPolicy(), quotas=quotas)
            for s in stores
        )
        yield a, b, stores[0]
    finally:
        for store in stores:
            store.close()


def _stored_elsewhere(
    a: LedgerService, store: Store, call_id: str, kind: str
) -> CallRef:
    """A call daemon `a` made and left `kind`: started, committed, or
    compacted to its tombstone."""
    started = run(a.prepare(spec(call_id)))
    ref = started.call.ref
    if kind == "started":
        return ref
    _commit(a, ref)
    if kind == "compacted":
        done = run(a.get(ref))
        tomb = retention.tombstone(done, done.updated_ns + 1)
        store.submit(lambda view: view.compact_call(done, tomb)).result(10)
    return ref


KINDS = ["started", "committed", "compacted"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_prepare_of_a_call_stored_by_another_daemon_answers_as_a_read(
    at_quota: tuple[LedgerService, LedgerService, Store],
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Daemon `b`, which never saw the call, tries it as a new one: its
    insert finds the call (a record, or a tombstone) and loses, and `b`
    answers, and leaves stored, what a read does on a twin call; the
    namespace at its quota (the two calls in it) refuses neither."""
    a, b, store = at_quota
    made_ref = _stored_elsewhere(a, store, f"made-{kind}", kind)
    read_ref = _stored_elsewhere(a, store, f"read-{kind}", kind)
    answered = _outcome(lambda: run(b.prepare(spec(made_ref.call_id))))
    with monkeypatch.context() as reading:
        reading.setattr(ledger_module, "made", _never)
        read = _outcome(lambda: run(b.prepare(spec(read_ref.call_id))))
    assert answered == read
    assert answered[0] != "EXECUTE"
    made_stored, made_tomb = store.read(lambda view: view.find_call(made_ref))
    read_stored, read_tomb = store.read(lambda view: view.find_call(read_ref))
    if kind == "compacted":
        assert (made_stored, read_stored) == (None, None)
        assert made_tomb is not None
        assert read_tomb is not None
        assert made_tomb.revision == read_tomb.revision
    else:
        assert made_stored is not None
        assert read_stored is not None
        assert (made_stored.state, made_stored.revision) == (
            read_stored.state,
            read_stored.revision,
        )


async def _never(*_: object) -> Answer | None:
    return None


def test_a_lost_insert_answered_from_its_decision_is_caught(
    at_quota: tuple[LedgerService, LedgerService, Store],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: a new call's decision answered although its insert
    lost: the prepare of a committed call tells its caller to execute it
    again."""
    a, b, store = at_quota
    tried = _stored_elsewhere(a, store, "tried", "committed")

    async def trusting(
        store: Store,
        recent: RecentCalls,
        ref: CallRef,
        decide: Callable[[LedgerReads], Decided],
    ) -> Answer | None:
        decision = decide(absent(ref))
        assert decision.write is not None
        with contextlib.suppress(Conflict):
            await store.save_call(decision.write)
        assert isinstance(decision.reply, Answer)
        return decision.reply

    monkeypatch.setattr(ledger_module, "made", trusting)
    assert _outcome(lambda: run(b.prepare(spec(tried.call_id))))[0] == "EXECUTE"


def test_a_call_this_daemon_saved_is_not_tried_as_new(
    at_quota: tuple[LedgerService, LedgerService, Store],
) -> None:
    """A daemon that saved a call (committed too) knows it stored: its
    repeat is decided on a read, not on an insert that would lose; a lost
    insert teaches another daemon the same."""
    a, b, store = at_quota
    ref = _stored_elsewhere(a, store, "known", "committed")
    assert a._recent.is_known(ref)
    assert not b._recent.is_known(ref)
    run(b.prepare(spec(ref.call_id)))
    assert b._recent.is_known(ref)


def test_the_calls_known_stored_are_bounded() -> None:
    recent = RecentCalls(known=2)
    refs = [CallRef("ns", "run", f"c{i}") for i in range(3)]
    for ref in refs:
        recent.know(ref)
    assert [recent.is_known(ref) for ref in refs] == [False, True, True]
