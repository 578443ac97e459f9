"""Approvals through the real server (contract §4.5, ADR-010 D3): approve, then the
agent executes; reject, then the agent gets the error result; an approval is
bound to the revision and input fingerprint it was given for, and a refused
one changes nothing and audits nothing."""

from __future__ import annotations

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from tests.rpc.support import expect_refusal, prepare_request, ref, refused
from tests.support.postgres import both_stores  # noqa: F401  (each store)

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INPUT = '{"to": "a@example.com", "amount": 100}'
OTHER_INPUT = '{"to": "b@example.com", "amount": 100}'


@pytest.fixture
def admin_stub(channel: grpc.Channel) -> admin_pb2_grpc.AdminStub:
    return admin_pb2_grpc.AdminStub(channel)


def _await(stub: ToolLedgerStub, json: str = INPUT) -> pb.ToolCall:
    answer = stub.PrepareTool(
        prepare_request(json=json, require_approval=True), timeout=5
    )
    assert answer.decision == pb.DECISION_AWAIT_APPROVAL
    return answer.call


def _decide(
    stub: ToolLedgerStub,
    call: pb.ToolCall,
    *,
    approve: bool = True,
    revision: int | None = None,
    fingerprint: str | None = None,
    approver: str = "alice",
) -> pb.ToolCall:
    request = pb.DecideApprovalRequest(
        ref=ref(),
        approve=approve,
        approver=approver,
        reason="within budget" if approve else "not today",
        expected_revision=call.revision if revision is None else revision,
        input_fingerprint=call.input_fingerprint
        if fingerprint is None
        else fingerprint,
    )
    return stub.DecideApproval(request, timeout=5).call


def _get(stub: ToolLedgerStub) -> pb.ToolCall:
    return stub.GetToolCall(pb.GetToolCallRequest(ref=ref()), timeout=5).call


def _audit(admin: admin_pb2_grpc.AdminStub) -> list[admin_pb2.AuditEntry]:
    return list(admin.ListAudit(admin_pb2.ListAuditRequest(), timeout=5).entries)


def test_approve_then_the_agent_executes(
    ledger_stub: ToolLedgerStub, admin_stub: admin_pb2_grpc.AdminStub
) -> None:
    """AWAIT_APPROVAL, approve -> PREPARED; then prepare answers EXECUTE and
    start holds attempt 1 (contract §4.5 approve, ADR-010 D3)."""
    waiting = _await(ledger_stub)
    approved = _decide(ledger_stub, waiting)
    assert approved.state == pb.CALL_STATE_PREPARED
    assert approved.revision == waiting.revision + 1
    assert approved.approval.approved
    assert (approved.approval.approver, approved.approval.reason) == (
        "alice",
        "within budget",
    )
    assert approved.approval.input_fingerprint == waiting.input_fingerprint
    assert approved.approval.revision == waiting.revision
    assert approved.approval.decided_at.ToNanoseconds() > 0
    assert [t.event for t in approved.history] == ["prepare", "approve"]
    assert approved.history[-1].actor == "alice"

    again = ledger_stub.PrepareTool(
        prepare_request(json=INPUT, require_approval=True), timeout=5
    )
    assert again.decision == pb.DECISION_EXECUTE
    started = ledger_stub.StartTool(pb.StartToolRequest(ref=ref()), timeout=5)
    assert started.decision == pb.DECISION_EXECUTE
    assert (started.call.state, started.call.attempt) == (pb.CALL_STATE_STARTED, 1)
    assert started.call.approval == approved.approval

    [entry] = _audit(admin_stub)
    assert entry.action == admin_pb2.AUDIT_ACTION_APPROVE
    assert (entry.actor, entry.reason) == ("alice", "within budget")
    assert (entry.revision_before, entry.revision_after) == (1, 2)
    assert (entry.state_before, entry.state_after) == (
        pb.CALL_STATE_AWAITING_APPROVAL,
        pb.CALL_STATE_PREPARED,
    )
    assert entry.details["inputFingerprint"] == waiting.input_fingerprint


def test_prepare_and_start_after_approval_holds_the_attempt(
    ledger_stub: ToolLedgerStub,
) -> None:
    """After approval, prepare with start=True holds attempt 1 in one trip."""
    _decide(ledger_stub, _await(ledger_stub))
    answer = ledger_stub.PrepareTool(
        prepare_request(json=INPUT, require_approval=True, start=True), timeout=5
    )
    assert (answer.decision, answer.attempt_held) == (pb.DECISION_EXECUTE, True)
    assert answer.call.attempt == 1


def test_reject_gives_the_error_result(
    ledger_stub: ToolLedgerStub, admin_stub: admin_pb2_grpc.AdminStub
) -> None:
    """Reject -> COMMITTED with APPROVAL_REJECTED; prepare and start answer
    REJECTED with that result, and nothing can execute (ADR-010 D3)."""
    rejected = _decide(ledger_stub, _await(ledger_stub), approve=False)
    assert rejected.state == pb.CALL_STATE_COMMITTED
    assert rejected.result.outcome == pb.OUTCOME_ERROR
    assert rejected.result.error_code == "APPROVAL_REJECTED"
    assert "not today" in rejected.result.error_message
    assert rejected.result.digest.startswith("sha256:")
    assert not rejected.approval.approved

    answer = ledger_stub.PrepareTool(
        prepare_request(json=INPUT, require_approval=True, start=True), timeout=5
    )
    assert answer.decision == pb.DECISION_REJECTED
    assert not answer.attempt_held
    assert answer.call.result == rejected.result
    started = ledger_stub.StartTool(pb.StartToolRequest(ref=ref()), timeout=5)
    assert started.decision == pb.DECISION_REJECTED
    assert _get(ledger_stub).attempt == 0
    [entry] = _audit(admin_stub)
    assert entry.action == admin_pb2.AUDIT_ACTION_REJECT
    assert entry.state_after == pb.CALL_STATE_COMMITTED


def test_other_input_after_approval_is_refused(ledger_stub: ToolLedgerStub) -> None:
    """The approval covers one input: a prepare with other input after it is
    INPUT_MISMATCH, and the approved record is unchanged (contract §3.3, §4.5)."""
    approved = _decide(ledger_stub, _await(ledger_stub))
    for start in (False, True):
        expect_refusal(
            lambda start=start: ledger_stub.PrepareTool(  # type: ignore[misc]
                prepare_request(json=OTHER_INPUT, require_approval=True, start=start),
                timeout=5,
            ),
            PRECONDITION,
            "INPUT_MISMATCH",
        )
    assert _get(ledger_stub) == approved


@pytest.mark.parametrize("approve", [True, False])
@pytest.mark.parametrize("seen", [0, 2, 5])
def test_approval_of_another_revision_changes_nothing(
    ledger_stub: ToolLedgerStub,
    admin_stub: admin_pb2_grpc.AdminStub,
    approve: bool,
    seen: int,
) -> None:
    """An approval for a revision the record is not at is ABORTED
    REVISION_CONFLICT with the current revision (0 is INVALID_ARGUMENT:
    the revision is required), and the record and audit log stay as they were."""
    waiting = _await(ledger_stub)
    if seen == 0:
        got = refused(
            lambda: _decide(ledger_stub, waiting, approve=approve, revision=0)
        )
        assert got.code == grpc.StatusCode.INVALID_ARGUMENT
        assert got.fields == ("expected_revision",)
    else:
        got = expect_refusal(
            lambda: _decide(ledger_stub, waiting, approve=approve, revision=seen),
            grpc.StatusCode.ABORTED,
            "REVISION_CONFLICT",
        )
        assert got.metadata["currentRevision"] == "1"
    assert _get(ledger_stub) == waiting
    assert _audit(admin_stub) == []


@pytest.mark.parametrize("approve", [True, False])
def test_approval_of_another_input_changes_nothing(
    ledger_stub: ToolLedgerStub, admin_stub: admin_pb2_grpc.AdminStub, approve: bool
) -> None:
    """An approval given for another input fingerprint is INPUT_MISMATCH, and
    the record and audit log stay as they were (contract §4.5)."""
    waiting = _await(ledger_stub)
    other = ledger_stub.PrepareTool(
        prepare_request(call_id="other", json=OTHER_INPUT), timeout=5
    ).call.input_fingerprint
    assert other != waiting.input_fingerprint
    got = expect_refusal(
        lambda: _decide(ledger_stub, waiting, approve=approve, fingerprint=other),
        PRECONDITION,
        "INPUT_MISMATCH",
    )
    assert got.metadata["inputFingerprint"] == waiting.input_fingerprint
    assert _get(ledger_stub) == waiting
    assert _audit(admin_stub) == []


def test_a_second_decision_is_refused(ledger_stub: ToolLedgerStub) -> None:
    """An approval is given once: a later decision at the old revision is
    REVISION_CONFLICT, at the new one INVALID_TRANSITION."""
    waiting = _await(ledger_stub)
    approved = _decide(ledger_stub, waiting)
    expect_refusal(
        lambda: _decide(ledger_stub, waiting, approve=False, approver="bob"),
        grpc.StatusCode.ABORTED,
        "REVISION_CONFLICT",
    )
    expect_refusal(
        lambda: _decide(ledger_stub, approved, approve=False, approver="bob"),
        PRECONDITION,
        "INVALID_TRANSITION",
    )
    assert _get(ledger_stub) == approved


def test_a_call_without_approval_cannot_be_decided(ledger_stub: ToolLedgerStub) -> None:
    """DecideApproval on a call that never awaited approval is INVALID_TRANSITION."""
    ledger_stub.PrepareTool(prepare_request(json=INPUT), timeout=5)
    call = _get(ledger_stub)
    expect_refusal(
        lambda: _decide(ledger_stub, call), PRECONDITION, "INVALID_TRANSITION"
    )
    assert _get(ledger_stub) == call


def test_approval_required_on_a_repeat_holds_a_prepared_call(
    ledger_stub: ToolLedgerStub,
) -> None:
    """A call prepared without approval and re-prepared with require_approval
    and start waits for an approver instead of executing; approved, it starts
    (issue 10 item 12: fails before the fix: EXECUTE with the attempt held)."""
    ledger_stub.PrepareTool(prepare_request(json=INPUT), timeout=5)
    request = prepare_request(json=INPUT, require_approval=True, start=True)
    answer = ledger_stub.PrepareTool(request, timeout=5)
    assert (answer.decision, answer.attempt_held) == (
        pb.DECISION_AWAIT_APPROVAL,
        False,
    )
    assert (answer.call.state, answer.call.approval_required) == (
        pb.CALL_STATE_AWAITING_APPROVAL,
        True,
    )
    assert answer.call.history[-1].event == "require_approval"
    _decide(ledger_stub, answer.call)
    started = ledger_stub.PrepareTool(request, timeout=5)
    assert (started.decision, started.attempt_held) == (pb.DECISION_EXECUTE, True)


def test_approval_cannot_be_required_after_the_call_started(
    ledger_stub: ToolLedgerStub,
) -> None:
    """A call that started without approval: a repeat that requires it is
    INPUT_MISMATCH and the record is unchanged."""
    ledger_stub.PrepareTool(prepare_request(json=INPUT, start=True), timeout=5)
    started = _get(ledger_stub)
    expect_refusal(
        lambda: ledger_stub.PrepareTool(
            prepare_request(json=INPUT, require_approval=True, start=True), timeout=5
        ),
        PRECONDITION,
        "INPUT_MISMATCH",
    )
    assert _get(ledger_stub) == started


def test_deciding_an_unknown_call_is_not_found(ledger_stub: ToolLedgerStub) -> None:
    """A decision on a record of another namespace, or none, is NOT_FOUND."""
    waiting = _await(ledger_stub)
    request = pb.DecideApprovalRequest(
        ref=ref(namespace="other"),
        approve=True,
        approver="alice",
        reason="ok",
        expected_revision=1,
        input_fingerprint=waiting.input_fingerprint,
    )
    expect_refusal(
        lambda: ledger_stub.DecideApproval(request, timeout=5),
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    assert _get(ledger_stub) == waiting


def test_bad_approval_requests_name_every_field(ledger_stub: ToolLedgerStub) -> None:
    """Every malformed field of a DecideApproval is named in one BadRequest."""
    request = pb.DecideApprovalRequest(
        ref=pb.CallRef(run_id="a:b"),
        approver="bad\x00name",
        reason="",
        input_fingerprint="md5:abc",
    )
    got = refused(lambda: ledger_stub.DecideApproval(request, timeout=5))
    assert got.code == grpc.StatusCode.INVALID_ARGUMENT
    assert got.fields is not None
    assert set(got.fields) == {
        "ref.run_id",
        "ref.call_id",
        "approver",
        "reason",
        "expected_revision",
        "input_fingerprint",
    }
