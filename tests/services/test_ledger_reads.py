"""A repeated prepare that changes nothing is answered from a read, without a
write transaction; one whose answer changes the record still goes through
the writer and is durable before it is answered. The negative control is a
read path that answers a change it never writes: the same check catches
it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import InputMismatch
from sidecar.ledger.fingerprint import fingerprint, result_digest
from sidecar.ledger.model import (
    Decision,
    Effect,
    Outcome,
    Payload,
    PayloadKind,
    Result,
    State,
)
from sidecar.ledger.rules import PrepareSpec
from sidecar.ledger.validation import Limits
from sidecar.services._common import Decided
from sidecar.services.ledger import LedgerService
from sidecar.storage import records
from sidecar.storage.api import ReadView
from sidecar.storage.lmdb.store import LmdbStore
from tests.services.support import SwitchablePolicy, spec

OUTPUT = Payload(PayloadKind.JSON, b'{"id": 7}')


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data")
    yield s
    s.close()


def _result() -> Result:
    return Result(Outcome.OK, OUTPUT, "", "", result_digest(Outcome.OK, OUTPUT, "", ""))


def test_duplicate_prepares_write_nothing(store: LmdbStore) -> None:
    """The duplicate of a committed call (RETURN_RESULT), of one in progress
    (IN_PROGRESS) and one with another input (INPUT_MISMATCH) are answered
    without a write transaction (fails before answering them from a read:
    each one was a transaction of the writer)."""
    ledger = LedgerService(store, ManualClock(), Limits(), SwitchablePolicy())

    async def scenario() -> None:
        done = await ledger.prepare(spec("done", Effect.SIDE_EFFECT))
        await ledger.commit(
            done.call.ref, attempt=1, result=_result(), expected_revision=None
        )
        await ledger.prepare(spec("running", Effect.SIDE_EFFECT))
        before = store.stats.transactions
        replay = await ledger.prepare(spec("done", Effect.SIDE_EFFECT))
        assert replay.decision is Decision.RETURN_RESULT
        assert replay.call.result == _result()
        busy = await ledger.prepare(spec("running", Effect.SIDE_EFFECT))
        assert busy.decision is Decision.IN_PROGRESS
        changed = Payload(PayloadKind.JSON, b'{"email": "b@example.com"}')
        other = dataclasses.replace(
            spec("done", Effect.SIDE_EFFECT),
            input=changed,
            fingerprint=fingerprint(changed),
        )
        with pytest.raises(InputMismatch):
            await ledger.prepare(other)
        assert store.stats.transactions == before

    asyncio.run(scenario())


def _changed_prepare_problems(store: LmdbStore) -> list[str]:
    """What goes wrong when a repeat prepare whose rule changes the record (a
    lease ran out: UNKNOWN, RECONCILE) is answered: [] when it was written."""
    clock = ManualClock()
    ledger = LedgerService(store, clock, Limits(), SwitchablePolicy())
    problems: list[str] = []

    async def scenario() -> None:
        first = await ledger.prepare(spec("c1", Effect.SIDE_EFFECT))
        clock.advance(3600)
        before = store.stats.transactions
        again = await ledger.prepare(spec("c1", Effect.SIDE_EFFECT))
        if again.decision is not Decision.RECONCILE:
            problems.append(f"answered {again.decision.name}")
        if store.stats.transactions != before + 1:
            problems.append("no write transaction")
        state = (await ledger.get(first.call.ref)).state
        if state is not State.UNKNOWN:
            problems.append(f"stored {state.name} behind a RECONCILE")

    asyncio.run(scenario())
    return problems


def test_a_prepare_that_changes_the_record_is_written(store: LmdbStore) -> None:
    """A repeat prepare of a call whose lease ran out makes it UNKNOWN, through
    a write transaction: the RECONCILE it answers is durable."""
    assert _changed_prepare_problems(store) == []


def _answers_every_repeat(
    decide: Callable[[LedgerService, ReadView, PrepareSpec], Decided],
) -> Callable[[LedgerService, ReadView, PrepareSpec], Decided]:
    """BROKEN on purpose: answers a repeat from the read even when its rule
    changes the record, which is then never written."""

    def broken(self: LedgerService, view: ReadView, spec: PrepareSpec) -> Decided:
        decision = decide(self, view, spec)
        if records.load_call(view, spec.ref) is None:
            return decision
        return Decided(decision.reply)

    return broken


def test_negative_control_a_read_that_answers_changes_is_caught(
    store: LmdbStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above catches a read path that answers a change it does not
    write."""
    monkeypatch.setattr(
        LedgerService,
        "_prepare_decision",
        _answers_every_repeat(LedgerService._prepare_decision),
    )
    assert _changed_prepare_problems(store) != []
