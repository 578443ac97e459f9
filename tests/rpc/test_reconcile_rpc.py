"""Reconciliation through the real server (contract §4.6, ADR-010 D3, R3): an
operator resolves a call of unknown outcome from evidence, by compare-and-swap,
with the evidence kept on the record and audited in the same transaction.

The race test sends the same reconciliation from several operator processes
at once, round after round: exactly one operator per round resolves the call.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.synchronize
import queue
from dataclasses import replace
from multiprocessing.queues import Queue
from typing import Any

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from sidecar.clock import ManualClock
from sidecar.composition import Services
from sidecar.config import ServeConfig
from sidecar.errors import EffectdError
from sidecar.ledger import operator_rules
from sidecar.ledger.model import CallRef
from sidecar.ledger.operator_rules import ReconcileOrder
from sidecar.ledger.rules import Answer
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.services.operator import OperatorService
from sidecar.storage import records
from sidecar.storage.api import Store, WriteView
from sidecar.testing import running_daemon
from tests.rpc.support import expect_refusal, prepare_request, ref, refused
from tests.support.postgres import both_stores  # noqa: F401  (each store)

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
FOUND = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json='{"id": "tx-42"}'))


def _unknown(
    stub: ToolLedgerStub,
    call_id: str = "call",
    effect: pb.Effect.ValueType = pb.EFFECT_SIDE_EFFECT,
) -> pb.ToolCall:
    """A call whose attempt 1 reported that it cannot tell whether it ran."""
    stub.PrepareTool(
        prepare_request(call_id=call_id, start=True, effect=effect), timeout=5
    )
    request = pb.ReportUnknownRequest(
        ref=ref(call_id=call_id), attempt=1, reason="timeout"
    )
    assert stub.ReportUnknown(request, timeout=5).call.state == pb.CALL_STATE_UNKNOWN
    # The whole record, its kept input too (an answer to the agent has none).
    return _get(stub, call_id)


def reconcile_request(
    revision: int,
    *,
    found: bool,
    call_id: str = "call",
    operator: str = "olga",
) -> pb.ReconcileRequest:
    request = pb.ReconcileRequest(
        ref=ref(call_id=call_id),
        expected_revision=revision,
        operator=operator,
        reason="checked the payment provider",
        evidence=f"provider ledger: tx-42 {'present' if found else 'absent'}",
    )
    if found:
        request.result.CopyFrom(FOUND)
    else:
        request.not_executed = True
        # The operator knows attempt 1 is dead; the quarantine that applies
        # without this word has its own tests below.
        request.confirmed_dead_attempt = 1
    return request


def _get(stub: ToolLedgerStub, call_id: str = "call") -> pb.ToolCall:
    return stub.GetToolCall(
        pb.GetToolCallRequest(ref=ref(call_id=call_id)), timeout=5
    ).call


def _audit(channel: grpc.Channel) -> list[admin_pb2.AuditEntry]:
    stub = admin_pb2_grpc.AdminStub(channel)
    return list(stub.ListAudit(admin_pb2.ListAuditRequest(), timeout=5).entries)


def test_found_result_commits_and_is_replayed(
    ledger_stub: ToolLedgerStub, channel: grpc.Channel
) -> None:
    """UNKNOWN side effect: prepare answers RECONCILE; reconciled with the result
    found, it is COMMITTED and prepare answers RETURN_RESULT with that result."""
    call = _unknown(ledger_stub)
    answer = ledger_stub.PrepareTool(prepare_request(), timeout=5)
    assert answer.decision == pb.DECISION_RECONCILE
    done = ledger_stub.Reconcile(
        reconcile_request(call.revision, found=True), timeout=5
    ).call
    assert done.state == pb.CALL_STATE_COMMITTED
    assert done.revision == call.revision + 1
    assert done.result.payload.json == '{"id": "tx-42"}'
    [rec] = done.reconciliations
    assert rec.resolution == pb.RESOLUTION_COMMITTED
    assert (rec.operator, rec.evidence) == ("olga", "provider ledger: tx-42 present")
    assert (rec.from_state, rec.revision, rec.attempt) == (
        pb.CALL_STATE_UNKNOWN,
        call.revision,
        1,
    )
    assert done.history[-1].event == "reconcile_committed"
    replay = ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    assert replay.decision == pb.DECISION_RETURN_RESULT
    assert not replay.attempt_held
    assert replay.call.result == done.result

    [entry] = _audit(channel)
    assert entry.action == admin_pb2.AUDIT_ACTION_RECONCILE_COMMITTED
    assert (entry.actor, entry.evidence) == ("olga", rec.evidence)
    assert (entry.ref.run_id, entry.ref.call_id, entry.ref.namespace) == (
        "run",
        "call",
        "default",
    )
    assert (entry.revision_before, entry.revision_after) == (3, 4)
    assert (entry.state_before, entry.state_after) == (
        pb.CALL_STATE_UNKNOWN,
        pb.CALL_STATE_COMMITTED,
    )
    assert entry.details["resultDigest"] == done.result.digest


@pytest.mark.parametrize(
    "effect", [pb.EFFECT_SIDE_EFFECT, pb.EFFECT_IDEMPOTENT_WRITE, pb.EFFECT_READ]
)
def test_not_executed_then_start_is_the_next_attempt(
    ledger_stub: ToolLedgerStub, effect: pb.Effect.ValueType
) -> None:
    """Verified never executed -> PREPARED; a new start is attempt 2 with the
    same idempotency key (ADR-010 D2, R4)."""
    call = _unknown(ledger_stub, effect=effect)
    done = ledger_stub.Reconcile(
        reconcile_request(call.revision, found=False), timeout=5
    ).call
    assert (done.state, done.attempt) == (pb.CALL_STATE_PREPARED, 1)
    assert done.reconciliations[0].resolution == pb.RESOLUTION_NOT_EXECUTED
    assert not done.HasField("result")
    answer = ledger_stub.PrepareTool(prepare_request(effect=effect), timeout=5)
    assert answer.decision == pb.DECISION_EXECUTE
    started = ledger_stub.StartTool(pb.StartToolRequest(ref=ref()), timeout=5)
    assert started.decision == pb.DECISION_EXECUTE
    assert started.call.attempt == 2
    assert started.call.idempotency_key == call.idempotency_key == "run:call"
    assert len(started.call.reconciliations) == 1


def test_a_stale_revision_changes_nothing(
    ledger_stub: ToolLedgerStub, channel: grpc.Channel
) -> None:
    """Reconcile at another revision is ABORTED REVISION_CONFLICT with the
    current revision; the record and the audit log are unchanged."""
    call = _unknown(ledger_stub)
    for seen in (call.revision - 1, call.revision + 1):
        got = expect_refusal(
            lambda seen=seen: ledger_stub.Reconcile(  # type: ignore[misc]
                reconcile_request(seen, found=False), timeout=5
            ),
            grpc.StatusCode.ABORTED,
            "REVISION_CONFLICT",
        )
        assert got.metadata["currentRevision"] == str(call.revision)
    assert _get(ledger_stub) == call
    assert _audit(channel) == []


def test_a_live_attempt_cannot_be_declared_never_executed(
    ledger_stub: ToolLedgerStub, clock: ManualClock
) -> None:
    """A STARTED call with a live lease may still execute: "not executed" is
    refused, even with its attempt confirmed dead; after the lease expires,
    "not executed" with that confirmation is accepted and the history shows
    the expiry."""
    ledger_stub.PrepareTool(prepare_request(start=True, lease_ms=10_000), timeout=5)
    started = _get(ledger_stub)
    got = expect_refusal(
        lambda: ledger_stub.Reconcile(
            reconcile_request(started.revision, found=False), timeout=5
        ),
        PRECONDITION,
        "INVALID_TRANSITION",
    )
    assert got.metadata["lease"] == "live"
    assert _get(ledger_stub) == started
    clock.advance(10)
    done = ledger_stub.Reconcile(
        reconcile_request(started.revision, found=False), timeout=5
    ).call
    assert done.state == pb.CALL_STATE_PREPARED
    assert [t.event for t in done.history[-2:]] == ["expire", "reconcile_not_executed"]
    assert done.reconciliations[0].from_state == pb.CALL_STATE_STARTED


def test_never_executed_waits_out_the_quarantine(
    ledger_stub: ToolLedgerStub, channel: grpc.Channel, clock: ManualClock
) -> None:
    """Without the operator's word that its attempt is dead, "never executed"
    is FAILED_PRECONDITION RECONCILE_QUARANTINE (nothing changes, nothing is
    audited) until the call has been UNKNOWN for 3 leases (30 s each by
    default), counted from `unknown_since`; then it is accepted (issue 10
    item 8: fails before the fix: accepted at once)."""
    call = _unknown(ledger_stub)
    assert call.unknown_since == call.updated_at
    request = reconcile_request(call.revision, found=False)
    request.ClearField("confirmed_dead_attempt")
    clock.advance(89)
    got = expect_refusal(
        lambda: ledger_stub.Reconcile(request, timeout=5),
        PRECONDITION,
        "RECONCILE_QUARANTINE",
    )
    assert got.metadata == {
        "attempt": "1",
        "quarantineMs": "90000",
        "remainingMs": "1000",
    }
    assert _get(ledger_stub) == call
    assert _audit(channel) == []
    clock.advance(1)
    done = ledger_stub.Reconcile(request, timeout=5).call
    assert done.state == pb.CALL_STATE_PREPARED
    assert not done.HasField("unknown_since")


def test_a_confirmed_dead_attempt_is_audited(
    ledger_stub: ToolLedgerStub, channel: grpc.Channel
) -> None:
    """The confirmation records "never executed" at once, and the audit entry
    keeps the operator's word."""
    call = _unknown(ledger_stub)
    done = ledger_stub.Reconcile(
        reconcile_request(call.revision, found=False), timeout=5
    ).call
    assert done.state == pb.CALL_STATE_PREPARED
    [entry] = _audit(channel)
    assert entry.details["confirmedDeadAttempt"] == "1"


def test_a_live_attempt_can_be_committed_from_evidence(
    ledger_stub: ToolLedgerStub,
) -> None:
    """The result found commits a STARTED call; the attempt's own later commit
    with another result is refused: the first result stands (ADR-010 D1)."""
    started = ledger_stub.PrepareTool(prepare_request(start=True), timeout=5).call
    ledger_stub.Reconcile(reconcile_request(started.revision, found=True), timeout=5)
    late = pb.CommitToolRequest(
        ref=ref(),
        attempt=1,
        result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}")),
    )
    expect_refusal(
        lambda: ledger_stub.CommitTool(late, timeout=5), PRECONDITION, "RESULT_MISMATCH"
    )


@pytest.mark.parametrize("found", [True, False])
def test_only_unresolved_calls_can_be_reconciled(
    ledger_stub: ToolLedgerStub, found: bool
) -> None:
    """Reconcile of a PREPARED, AWAITING_APPROVAL or COMMITTED call is
    INVALID_TRANSITION and changes nothing (contract §4.6)."""
    ledger_stub.PrepareTool(prepare_request(call_id="p"), timeout=5)
    prepared = _get(ledger_stub, "p")
    waiting = ledger_stub.PrepareTool(
        prepare_request(call_id="a", require_approval=True), timeout=5
    ).call
    committed = _unknown(ledger_stub, call_id="c")
    committed = ledger_stub.Reconcile(
        reconcile_request(committed.revision, found=True, call_id="c"), timeout=5
    ).call
    for call in (prepared, waiting, committed):
        call_id = call.ref.call_id
        expect_refusal(
            lambda c=call: ledger_stub.Reconcile(  # type: ignore[misc]
                reconcile_request(c.revision, found=found, call_id=c.ref.call_id),
                timeout=5,
            ),
            PRECONDITION,
            "INVALID_TRANSITION",
        )
        assert _get(ledger_stub, call_id) == call


def test_bad_reconcile_requests_name_every_field(ledger_stub: ToolLedgerStub) -> None:
    """Every malformed field of a Reconcile is named in one BadRequest; a found
    result may not claim APPROVAL_REJECTED."""
    bare = refused(
        lambda: ledger_stub.Reconcile(pb.ReconcileRequest(ref=ref()), timeout=5)
    )
    assert bare.code == grpc.StatusCode.INVALID_ARGUMENT
    assert set(bare.fields or ()) == {
        "operator",
        "reason",
        "evidence",
        "expected_revision",
        "resolution",
    }
    request = reconcile_request(3, found=True)
    request.result.outcome = pb.OUTCOME_ERROR
    request.result.error_code = "APPROVAL_REJECTED"
    got = refused(lambda: ledger_stub.Reconcile(request, timeout=5))
    assert got.fields == ("result.error_code",)
    false = reconcile_request(3, found=False)
    false.not_executed = False
    assert refused(lambda: ledger_stub.Reconcile(false, timeout=5)).fields == (
        "not_executed",
    )


# -- two operators at once ------------------------------------------------------

OPERATORS = 4
ROUNDS = 40


def operator_worker(
    index: int,
    target: str,
    revisions: list[int],
    barrier: multiprocessing.synchronize.Barrier,
    out: Queue[Any],
) -> None:
    """One operator process: each round, wait for the others, then resolve
    call r at the revision all operators saw."""
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        grpc.channel_ready_future(channel).result(timeout=30)
        for r, revision in enumerate(revisions):
            request = reconcile_request(
                revision, found=index % 2 == 0, call_id=f"c{r}", operator=f"op-{index}"
            )
            barrier.wait(timeout=60)
            try:
                stub.Reconcile(request, timeout=30)
                out.put((index, r, "won"))
            except grpc.RpcError as exc:
                out.put((index, r, exc.code().name))


def _race(target: str, revisions: list[int]) -> list[tuple[int, int, str]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(OPERATORS)
    out: Queue[Any] = ctx.Queue()
    procs = [
        ctx.Process(target=operator_worker, args=(i, target, revisions, barrier, out))
        for i in range(OPERATORS)
    ]
    for p in procs:
        p.start()
    outcomes: list[tuple[int, int, str]] = []
    try:
        while len(outcomes) < OPERATORS * len(revisions):
            outcomes.append(out.get(timeout=60))
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return outcomes


class RacyOperatorService(OperatorService):
    """BROKEN on purpose: reads the record outside the write transaction and
    writes blindly, so concurrent operators all see the revision they expect."""

    async def reconcile(self, ref: CallRef, order: ReconcileOrder) -> Answer:
        old = self._store.read(lambda view: records.load_call(view, ref))
        assert old is not None
        # A real pause between the read and the write: the window the race needs.
        await asyncio.sleep(0.01)
        step = operator_rules.reconcile(old, self._store.read(self.now), order)

        def blind_write(view: WriteView) -> Answer | EffectdError:
            records.save_call(view, old, step.call)
            return step.reply

        reply = await asyncio.wrap_future(self._store.submit(blind_write))
        if isinstance(reply, EffectdError):
            raise reply
        return reply


class RacyDaemon(Daemon):
    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        operator = RacyOperatorService(store, self.seams.clock, self.config.limits)
        return replace(services, operator=operator)


def _setup(target: str) -> list[int]:
    with grpc.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        return [_unknown(stub, call_id=f"c{r}").revision for r in range(ROUNDS)]


def _double_wins(outcomes: list[tuple[int, int, str]]) -> dict[int, list[int]]:
    """Rounds in which not exactly one operator won, with the winners."""
    winners: dict[int, list[int]] = {r: [] for r in range(ROUNDS)}
    for index, r, result in outcomes:
        if result == "won":
            winners[r].append(index)
        else:
            assert result == "ABORTED", (index, r, result)
    return {r: w for r, w in winners.items() if len(w) != 1}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_concurrent_operators_resolve_once(
    ledger_stub: ToolLedgerStub, channel: grpc.Channel, daemon: Any
) -> None:
    """Per round, of 4 operator processes resolving one call at the same
    revision exactly one wins and the others get ABORTED; the record keeps one
    reconciliation, the winner's, and the audit log one entry per round."""
    revisions = _setup(daemon.target)
    outcomes = _race(daemon.target, revisions)
    assert len(outcomes) == OPERATORS * ROUNDS
    assert _double_wins(outcomes) == {}
    for index, r, result in outcomes:
        if result != "won":
            continue
        call = _get(ledger_stub, f"c{r}")
        [rec] = call.reconciliations
        assert rec.operator == f"op-{index}"
        expected = pb.CALL_STATE_COMMITTED if index % 2 == 0 else pb.CALL_STATE_PREPARED
        assert call.state == expected
    assert len(_audit(channel)) == ROUNDS
    verdict = admin_pb2_grpc.AdminStub(channel).VerifyAudit(
        admin_pb2.VerifyAuditRequest(), timeout=5
    )
    assert (verdict.ok, verdict.entries_checked) == (True, ROUNDS)


@pytest.mark.timeout(120)
def test_the_race_check_catches_a_racy_service(config: ServeConfig) -> None:
    """Negative control: an operator service that reads outside the write
    transaction lets several operators win one round, and the check sees it."""
    with running_daemon(
        config, daemon=RacyDaemon(config, Seams(clock=ManualClock()))
    ) as racy:
        outcomes = _race(racy.target, _setup(racy.target))
    assert _double_wins(outcomes) != {}


def test_the_attempt_reconciled_as_never_executed_is_stale(
    ledger_stub: ToolLedgerStub,
) -> None:
    """After "never executed" the call is PREPARED again and attempt 1 no
    longer holds it: its commit, heartbeat and unknown-report are
    STALE_ATTEMPT (docs/ledger.md), and nothing changes. Fails before the
    fix: they were INVALID_TRANSITION, as if no attempt had ever held the
    call (found by the model-based torture test, issue 15)."""
    call = _unknown(ledger_stub)
    done = ledger_stub.Reconcile(
        reconcile_request(call.revision, found=False), timeout=5
    ).call
    assert (done.state, done.attempt) == (pb.CALL_STATE_PREPARED, 1)
    requests = [
        lambda: ledger_stub.CommitTool(
            pb.CommitToolRequest(ref=ref(), attempt=1, result=FOUND), timeout=5
        ),
        lambda: ledger_stub.Heartbeat(
            pb.HeartbeatRequest(ref=ref(), attempt=1), timeout=5
        ),
        lambda: ledger_stub.ReportUnknown(
            pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="late"), timeout=5
        ),
    ]
    for send in requests:
        expect_refusal(send, PRECONDITION, "STALE_ATTEMPT")
    assert _get(ledger_stub).revision == done.revision
