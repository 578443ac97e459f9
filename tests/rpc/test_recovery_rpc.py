"""`effectd.v1.Recovery` through a real server (contract §6.1, ADR-010 D3)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import recovery_pb2 as rpb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.clock import ManualClock
from sidecar.ledger.recovery import RecoveryAction
from tests.rpc.support import expect_refusal, prepare_request, ref, refused
from tests.support.postgres import both_stores  # noqa: F401  (each store)

Ledger = ledger_pb2_grpc.ToolLedgerStub
RESULT = b"\x00receipt\xff"


@pytest.fixture
def recovery_stub(channel: grpc.Channel) -> recovery_pb2_grpc.RecoveryStub:
    return recovery_pb2_grpc.RecoveryStub(channel)


def _started(ledger: Ledger, call_id: str, effect: pb.Effect.ValueType) -> pb.ToolCall:
    answer = ledger.PrepareTool(
        prepare_request("run", call_id, effect=effect, start=True, lease_ms=1000)
    )
    assert answer.attempt_held
    return answer.call


def _committed(ledger: Ledger, call_id: str) -> pb.ToolCall:
    call = _started(ledger, call_id, pb.EFFECT_SIDE_EFFECT)
    done = ledger.CommitTool(
        pb.CommitToolRequest(
            ref=ref("run", call_id),
            attempt=call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(raw=RESULT)),
        )
    )
    return done.call


def _recover(stub: recovery_pb2_grpc.RecoveryStub, **kw: Any) -> rpb.RecoverResponse:
    return stub.Recover(rpb.RecoverRequest(run_id="run", **kw), timeout=5)


def _actions(answer: rpb.RecoverResponse) -> dict[str, int]:
    return {i.call.ref.call_id: i.action for i in answer.items}


def test_recover_plans_every_call_of_the_run(
    ledger_stub: Ledger, recovery_stub: recovery_pb2_grpc.RecoveryStub
) -> None:
    """Each call gets its contract §6.1 action; committed ones carry the exact
    stored result; the unknown side effect interrupts the run."""
    ledger_stub.PrepareTool(prepare_request("run", "fresh"))
    ledger_stub.PrepareTool(prepare_request("run", "gated", require_approval=True))
    _committed(ledger_stub, "done")
    se = _started(ledger_stub, "charge", pb.EFFECT_SIDE_EFFECT)
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref("run", "charge"), attempt=se.attempt)
    )
    w = _started(ledger_stub, "upsert", pb.EFFECT_IDEMPOTENT_WRITE)
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref("run", "upsert"), attempt=w.attempt)
    )
    ledger_stub.PrepareTool(prepare_request("other-run", "x"))

    answer = _recover(recovery_stub)
    assert _actions(answer) == {
        "charge": rpb.RECOVERY_ACTION_RECONCILE,
        "done": rpb.RECOVERY_ACTION_REPLAY_RESULT,
        "fresh": rpb.RECOVERY_ACTION_EXECUTE,
        "gated": rpb.RECOVERY_ACTION_WAIT_FOR_APPROVAL,
        "upsert": rpb.RECOVERY_ACTION_RETRY_NEEDS_POLICY,
    }
    assert answer.interrupted
    assert answer.settled == 0
    items = {i.call.ref.call_id: i for i in answer.items}
    assert items["done"].result.payload.raw == RESULT
    assert items["done"].result.outcome == pb.OUTCOME_OK
    assert not items["fresh"].HasField("result")
    assert items["upsert"].idempotency_key == "run:upsert"
    assert items["charge"].idempotency_key == ""
    assert items["charge"].effect == pb.EFFECT_SIDE_EFFECT


def test_recover_turns_stale_started_calls_unknown_and_executes_nothing(
    ledger_stub: Ledger,
    recovery_stub: recovery_pb2_grpc.RecoveryStub,
    clock: ManualClock,
) -> None:
    """A STARTED call whose lease expired becomes UNKNOWN durably, with an
    expire history entry; no attempt is started; a live one stays STARTED."""
    # contract §6.1 "settles the run's stale STARTED calls to UNKNOWN"; D3.
    _started(ledger_stub, "stale", pb.EFFECT_SIDE_EFFECT)
    clock.advance(2)
    live = _started(ledger_stub, "live", pb.EFFECT_READ)

    answer = _recover(recovery_stub)
    assert answer.settled == 1
    assert _actions(answer) == {
        "live": rpb.RECOVERY_ACTION_RETRY_NEEDS_POLICY,
        "stale": rpb.RECOVERY_ACTION_RECONCILE,
    }
    stale = ledger_stub.GetToolCall(pb.GetToolCallRequest(ref=ref("run", "stale"))).call
    assert stale.state == pb.CALL_STATE_UNKNOWN
    assert stale.attempt == 1
    assert [t.event for t in stale.history][-1] == "expire"
    now_live = ledger_stub.GetToolCall(
        pb.GetToolCallRequest(ref=ref("run", "live"))
    ).call
    assert (now_live.state, now_live.revision) == (pb.CALL_STATE_STARTED, live.revision)

    again = _recover(recovery_stub)
    assert again.settled == 0
    assert [i.call.revision for i in again.items] == [
        i.call.revision for i in answer.items
    ]


def test_acknowledge_marks_replayed_results_delivered(
    ledger_stub: Ledger, recovery_stub: recovery_pb2_grpc.RecoveryStub
) -> None:
    """AcknowledgeRecovery sets `acknowledged` with a history entry, once; a
    repeat changes nothing."""
    before = _committed(ledger_stub, "done")
    request = rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=["done"])
    [call] = recovery_stub.AcknowledgeRecovery(request, timeout=5).calls
    assert call.acknowledged
    assert call.revision == before.revision + 1
    assert call.history[-1].event == "acknowledge"
    assert call.result.payload.raw == RESULT
    [again] = recovery_stub.AcknowledgeRecovery(request, timeout=5).calls
    assert again == call


@pytest.mark.parametrize("rejected", [False, True], ids=["result", "rejection"])
def test_an_acknowledged_result_is_already_delivered_not_replayed(
    ledger_stub: Ledger,
    recovery_stub: recovery_pb2_grpc.RecoveryStub,
    rejected: bool,
) -> None:
    """Once acknowledged, a committed call's item is ALREADY_DELIVERED without a
    result to append, so an agent cannot append it twice (issue 10 item 14:
    fails before the fix: it was REPLAY_RESULT with the result again)."""
    if rejected:
        gated = ledger_stub.PrepareTool(
            prepare_request("run", "done", require_approval=True)
        ).call
        ledger_stub.DecideApproval(
            pb.DecideApprovalRequest(
                ref=ref("run", "done"),
                approve=False,
                approver="ada",
                reason="no",
                expected_revision=gated.revision,
                input_fingerprint=gated.input_fingerprint,
            )
        )
    else:
        _committed(ledger_stub, "done")
    [before] = _recover(recovery_stub).items
    assert before.HasField("result")
    replay = rpb.RECOVERY_ACTION_REPLAY_RESULT
    assert before.action == (rpb.RECOVERY_ACTION_ERROR_RESULT if rejected else replay)
    request = rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=["done"])
    recovery_stub.AcknowledgeRecovery(request, timeout=5)
    answer = _recover(recovery_stub)
    [item] = answer.items
    assert item.action == rpb.RECOVERY_ACTION_ALREADY_DELIVERED
    assert not item.HasField("result")
    # The record still holds the result, for whoever reads it.
    assert item.call.acknowledged
    assert item.call.HasField("result")
    assert not answer.interrupted


def test_acknowledge_is_all_or_nothing(
    ledger_stub: Ledger, recovery_stub: recovery_pb2_grpc.RecoveryStub
) -> None:
    """A batch with a call that is not COMMITTED is INVALID_TRANSITION naming its
    index, and the committed call of the batch is not acknowledged either."""
    _committed(ledger_stub, "done")
    ledger_stub.PrepareTool(prepare_request("run", "fresh"))
    request = rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=["done", "fresh"])
    got = expect_refusal(
        lambda: recovery_stub.AcknowledgeRecovery(request, timeout=5),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_TRANSITION",
    )
    assert got.metadata["index"] == "1"
    done = ledger_stub.GetToolCall(pb.GetToolCallRequest(ref=ref("run", "done"))).call
    assert not done.acknowledged


def test_another_namespace_sees_nothing(
    ledger_stub: Ledger, recovery_stub: recovery_pb2_grpc.RecoveryStub
) -> None:
    """Recover in another namespace is an empty plan and Acknowledge is
    NOT_FOUND: no record of the default namespace leaks."""
    # contract §3.1 "A record of another namespace answers `NOT_FOUND`".
    _committed(ledger_stub, "done")
    answer = _recover(recovery_stub, namespace="other")
    assert list(answer.items) == []
    assert not answer.interrupted
    request = rpb.AcknowledgeRecoveryRequest(
        namespace="other", run_id="run", call_ids=["done"]
    )
    got = expect_refusal(
        lambda: recovery_stub.AcknowledgeRecovery(request, timeout=5),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    assert got.metadata["namespace"] == "other"
    assert "receipt" not in got.message


@pytest.mark.parametrize(
    ("request_", "fields"),
    [
        (rpb.RecoverRequest(), ("run_id",)),
        (rpb.RecoverRequest(run_id="a:b", namespace="bad ns"), ("namespace", "run_id")),
    ],
)
def test_recover_refuses_bad_input_by_field(
    recovery_stub: recovery_pb2_grpc.RecoveryStub,
    request_: rpb.RecoverRequest,
    fields: tuple[str, ...],
) -> None:
    """A bad Recover request is INVALID_ARGUMENT naming each bad field."""
    got = refused(lambda: recovery_stub.Recover(request_, timeout=5))
    assert (got.code, got.reason, got.fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        fields,
    )


@pytest.mark.parametrize(
    ("call_ids", "fields"),
    [
        ([], ("call_ids",)),
        (["a", "", "a"], ("call_ids[1]", "call_ids[2]")),
        (["x\x07"], ("call_ids[0]",)),
    ],
)
def test_acknowledge_refuses_bad_input_by_field(
    recovery_stub: recovery_pb2_grpc.RecoveryStub,
    call_ids: list[str],
    fields: tuple[str, ...],
) -> None:
    """A bad AcknowledgeRecovery request names each bad call id by index."""
    request = rpb.AcknowledgeRecoveryRequest(run_id="run", call_ids=call_ids)
    got = refused(lambda: recovery_stub.AcknowledgeRecovery(request, timeout=5))
    assert (got.code, got.fields) == (grpc.StatusCode.INVALID_ARGUMENT, fields)


@pytest.mark.parametrize("service", ["effectd.v1.Recovery", "effectd.v1.RetryPolicy"])
def test_the_services_report_serving(channel: grpc.Channel, service: str) -> None:
    """Health answers SERVING for the Recovery and RetryPolicy services."""
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_actions_on_the_wire_are_the_design_names() -> None:
    """RecoveryAction is RECOVERY_ACTION_ plus exactly the contract §6.1 names (and
    ALREADY_DELIVERED, which splits acknowledged calls off REPLAY_RESULT), and
    every domain action has its wire value."""
    design = [
        "REPLAY_RESULT",
        "RECONCILE",
        "WAIT_FOR_APPROVAL",
        "ERROR_RESULT",
        "EXECUTE",
        "RETRY_NEEDS_POLICY",
        "ALREADY_DELIVERED",
    ]
    assert set(rpb.RecoveryAction.keys()) == {
        "RECOVERY_ACTION_UNSPECIFIED",
        *(f"RECOVERY_ACTION_{name}" for name in design),
    }
    assert sorted(a.name for a in RecoveryAction) == sorted(design)
