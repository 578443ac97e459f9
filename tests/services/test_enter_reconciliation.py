"""Putting every open call of a tool into reconciliation (ADR-010 R2, contract
§7.3), on a real store: every open call of the tool in scope becomes a
SIDE_EFFECT for good, each with its audit entry, in bounded batches, and
none is offered a retry afterwards whatever the policy says."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.clock import ManualClock
from sidecar.errors import ReconciliationRequired
from sidecar.ledger import audit, operator_rules
from sidecar.ledger.model import CallRef, Decision, Effect, State, ToolCall
from sidecar.ledger.policy import FixedPolicy, Policy
from sidecar.ledger.rules import Answer
from sidecar.ledger.validation import Limits
from sidecar.services import enter_reconciliation as entering
from sidecar.services.ledger import LedgerService
from sidecar.services.operator import OperatorService
from sidecar.storage import keys, records
from sidecar.storage.api import ReadView, Table, WriteView
from sidecar.storage.lmdb.store import LmdbStore
from tests.ledger.builders import ok_result
from tests.services.support import TOOL, spec

OTHER_TOOL = "send_email"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path / "data")
    yield s
    s.close()


@dataclasses.dataclass
class World:
    ledger: LedgerService
    operator: OperatorService


def _world(store: LmdbStore) -> World:
    clock = ManualClock()
    policy = FixedPolicy(Policy())
    return World(
        LedgerService(store, clock, Limits(), policy),
        OperatorService(store, clock, Limits(), policy),
    )


async def _seed(w: World) -> None:
    """Namespace a: TOOL calls in every state (an UNKNOWN SIDE_EFFECT among
    them), a call of another tool; namespace b: an UNKNOWN TOOL call."""
    for n in range(3):
        unknown = await w.ledger.prepare(spec(f"unknown-{n}"))
        await w.ledger.report_unknown(unknown.call.ref, attempt=1, reason="lost")
    await w.ledger.prepare(spec("started", Effect.READ))
    await w.ledger.prepare(spec("prepared", start=False))
    waiting = dataclasses.replace(spec("awaiting", start=False), require_approval=True)
    await w.ledger.prepare(waiting)
    done = await w.ledger.prepare(spec("committed"))
    await w.ledger.commit(
        done.call.ref, attempt=1, result=ok_result(), expected_revision=None
    )
    se = await w.ledger.prepare(spec("side-effect", Effect.SIDE_EFFECT))
    await w.ledger.report_unknown(se.call.ref, attempt=1, reason="lost")
    other = await w.ledger.prepare(spec("other", tool_name=OTHER_TOOL))
    await w.ledger.report_unknown(other.call.ref, attempt=1, reason="lost")
    b = await w.ledger.prepare(spec("unknown-b", namespace="b"))
    await w.ledger.report_unknown(b.call.ref, attempt=1, reason="lost")


def _calls(store: LmdbStore) -> list[ToolCall]:
    def scan(view: ReadView) -> list[ToolCall]:
        return [records.decode_call(raw) for _, raw in view.scan(Table.CALLS, b"")]

    return store.read(scan)


def retryable(store: LmdbStore, tool_name: str, namespace: str | None) -> list[str]:
    """The open calls of the tool in scope that a retry or a later policy could
    still treat as retry-safe."""
    return [
        f"{c.ref.namespace}/{c.ref.call_id}"
        for c in _calls(store)
        if c.tool_name == tool_name
        and (namespace is None or c.ref.namespace == namespace)
        and c.state is not State.COMMITTED
        and c.recorded_effect is not Effect.SIDE_EFFECT
    ]


def test_every_open_call_of_the_tool_becomes_a_side_effect_for_good(
    store: LmdbStore,
) -> None:
    """In namespace a, every open call of the tool is made a SIDE_EFFECT, in
    batches of 2, each with its history and audit entry; the committed call,
    the call already a SIDE_EFFECT, another tool's and another namespace's are
    left alone. Afterwards, under the default policy, an UNKNOWN one answers
    RECONCILE and its retry is refused (issue 10 item 10: fails before the
    fix: there was no such action, and the retry started attempt 2)."""
    w = _world(store)

    async def scenario() -> None:
        await _seed(w)
        done = await w.operator.enter_reconciliation(
            tool_name=TOOL, namespace="default", operator="olga", reason="dup", batch=2
        )
        assert done.forced == {
            State.UNKNOWN: 3,
            State.STARTED: 1,
            State.PREPARED: 1,
            State.AWAITING_APPROVAL: 1,
        }
        assert done.already == 1
        assert done.batches >= 3
        assert retryable(store, TOOL, "default") == []
        assert retryable(store, TOOL, "b") == ["b/unknown-b"]
        assert retryable(store, OTHER_TOOL, None) == ["default/other"]
        ref = CallRef("default", "run-1", "unknown-0")
        answer = await w.ledger.prepare(spec("unknown-0", start=False))
        assert answer.decision is Decision.RECONCILE
        with pytest.raises(ReconciliationRequired):
            await w.ledger.start(ref, lease_ms=0, retry=True, expected_revision=None)
        page = await w.operator.list_audit(
            namespace="default", newest_first=False, page_size=100, page_token=""
        )
        entries = page.entries
        assert [e.sequence for e in entries] == list(
            range(done.first_audit_sequence, done.last_audit_sequence + 1)
        )
        assert {e.fact.action for e in entries} == {audit.Action.ENTER_RECONCILIATION}
        assert all(e.fact.actor == "olga" and e.fact.reason == "dup" for e in entries)
        assert (await w.operator.verify_audit()).ok
        again = await w.operator.enter_reconciliation(
            tool_name=TOOL, namespace="default", operator="olga", reason="dup"
        )
        assert (again.forced_total, again.already) == (0, 7)

    asyncio.run(scenario())


def test_every_namespace_when_none_is_named(store: LmdbStore) -> None:
    """Without a namespace the walk covers every namespace."""
    w = _world(store)

    async def scenario() -> None:
        await _seed(w)
        done = await w.operator.enter_reconciliation(
            tool_name=TOOL, namespace=None, operator="olga", reason="dup"
        )
        assert done.forced[State.UNKNOWN] == 4
        assert retryable(store, TOOL, None) == []

    asyncio.run(scenario())


async def _first_batch_only(w: World, store: LmdbStore, batch: int) -> None:
    """BROKEN on purpose: one batch, as if the walk forgot where to go on."""

    def apply(view: WriteView) -> object:
        return entering._batch(
            view,
            w.operator.now(view),
            prefix=keys.namespace_prefix("default"),
            after=None,
            tool_name=TOOL,
            operator="olga",
            reason="dup",
            batch=batch,
            budget=entering.SCAN_BUDGET,
        )

    await asyncio.wrap_future(store.submit(apply))


def test_negative_control_a_walk_that_stops_after_one_batch_is_caught(
    store: LmdbStore,
) -> None:
    """The check finds the calls a walk that stops after its first batch
    leaves open to retries."""
    w = _world(store)

    async def scenario() -> None:
        await _seed(w)
        await _first_batch_only(w, store, batch=2)
        assert len(retryable(store, TOOL, "default")) == 4

    asyncio.run(scenario())


def test_a_small_scan_budget_still_covers_everything(store: LmdbStore) -> None:
    """A scan budget of one record per transaction still reaches every call."""
    w = _world(store)

    async def scenario() -> None:
        await _seed(w)
        done = await entering.enter_reconciliation(
            store,
            w.operator.now,
            tool_name=TOOL,
            namespace="default",
            operator="olga",
            reason="dup",
            budget=1,
        )
        assert done.forced_total == 6
        assert done.examined == 9
        assert retryable(store, TOOL, "default") == []

    asyncio.run(scenario())


def test_an_entered_call_answers_are_decisions(store: LmdbStore) -> None:
    """The rule answers the call's decision after the change."""
    w = _world(store)

    async def scenario() -> None:
        await _seed(w)
        call = next(c for c in _calls(store) if c.ref.call_id == "unknown-1")
        step = operator_rules.enter_reconciliation(
            call, store.read(w.operator.now), "o", "r"
        )
        assert isinstance(step.reply, Answer)
        assert step.reply.decision is Decision.RECONCILE

    asyncio.run(scenario())


def test_a_record_of_an_unknown_key_scheme_is_left_alone(store: LmdbStore) -> None:
    """A newer daemon's record (a key scheme this one does not know) is
    skipped and counted, never changed; the rest of the walk goes on."""
    w = _world(store)

    async def scenario() -> None:
        await _seed(w)
        newer = dataclasses.replace(
            next(c for c in _calls(store) if c.ref.call_id == "unknown-2"),
            key_scheme=99,
        )
        raw = records.encode_call(newer)

        def put(view: WriteView) -> None:
            view.put(Table.CALLS, keys.call_key(newer.ref), raw)

        await asyncio.wrap_future(store.submit(put))
        done = await w.operator.enter_reconciliation(
            tool_name=TOOL, namespace="default", operator="olga", reason="dup"
        )
        assert (done.skipped, done.forced[State.UNKNOWN]) == (1, 2)
        stored = store.read(
            lambda view: view.get(Table.CALLS, keys.call_key(newer.ref))
        )
        assert stored == raw

    asyncio.run(scenario())
