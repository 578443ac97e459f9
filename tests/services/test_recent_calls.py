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
import dataclasses
import random
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import EffectdError
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
from sidecar.ledger.rules import Answer
from sidecar.ledger.validation import Limits
from sidecar.services import ledger as ledger_module
from sidecar.services._common import Decided
from sidecar.services.ledger import LedgerService
from sidecar.services.recent_calls import RecentCalls
from sidecar.storage.api import ReadView, Store
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.table_ledger import NO_READS
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
