"""The tool-call ledger through the real server (contract §3-§5, ADR-010 D2, D3):
decisions, byte-exact results, fingerprints, revisions, leases on the manual
clock, fencing by attempt, batches, namespaces, listings and history."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.checkpoints_pb2_grpc import CheckpointsStub
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from effectd_client import Client, Decision, Effect, State
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import running_daemon
from tests.rpc.support import DOMAIN, expect_refusal, prepare_request, ref, refused
from tests.support.postgres import both_stores  # noqa: F401  (each store)

PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
SECOND_NS = 1_000_000_000


def start(
    stub: ToolLedgerStub,
    run_id: str = "run",
    call_id: str = "call",
    *,
    retry: bool = False,
    lease_ms: int = 0,
    expected_revision: int | None = None,
    namespace: str = "",
) -> pb.StartToolResponse:
    request = pb.StartToolRequest(
        ref=ref(run_id, call_id, namespace),
        retry=retry,
        lease_ms=lease_ms,
        expected_revision=expected_revision,
    )
    return stub.StartTool(request, timeout=5)


def commit(
    stub: ToolLedgerStub,
    attempt: int,
    payload: pb.Payload | None = None,
    *,
    run_id: str = "run",
    call_id: str = "call",
    namespace: str = "",
) -> pb.ToolCall:
    request = pb.CommitToolRequest(
        ref=ref(run_id, call_id, namespace),
        attempt=attempt,
        result=pb.ToolResult(
            outcome=pb.OUTCOME_OK,
            payload=payload if payload is not None else pb.Payload(json="{}"),
        ),
    )
    return stub.CommitTool(request, timeout=5).call


def get(
    stub: ToolLedgerStub, run_id: str = "run", call_id: str = "call", ns: str = ""
) -> pb.ToolCall:
    return stub.GetToolCall(
        pb.GetToolCallRequest(ref=ref(run_id, call_id, ns)), timeout=5
    ).call


def events(call: pb.ToolCall) -> list[str]:
    return [t.event for t in call.history]


# -- the happy path and repeats -----------------------------------------------


def test_prepare_start_commit(client: Client) -> None:
    """prepare records PREPARED, start holds attempt 1, commit stores the
    result: three revisions, one per change."""
    prepared = client.prepare_tool("run", "call", "send_email", {"to": "a@b.c"})
    assert prepared.decision is Decision.EXECUTE
    assert not prepared.attempt_held
    assert (prepared.call.state, prepared.call.revision) == (State.PREPARED, 1)
    assert prepared.call.attempt == 0
    started = client.start_tool("run", "call")
    assert started.decision is Decision.EXECUTE
    assert (started.call.state, started.call.revision) == (State.STARTED, 2)
    assert started.call.attempt == 1
    committed = client.commit_tool("run", "call", 1, {"id": 7})
    assert (committed.state, committed.revision) == (State.COMMITTED, 3)
    assert committed.result is not None
    assert committed.result.ok
    assert committed.result.value == {"id": 7}
    assert committed.result.digest.startswith("sha256:")


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(pb.Payload(raw=b"\x00\xff binary \r\n"), id="raw-bytes"),
        pytest.param(pb.Payload(json='{ "b":1,  "a":2 }'), id="json-odd-spacing"),
        pytest.param(pb.Payload(json='"caf\\u00e9 é"\n'), id="json-escapes"),
    ],
)
def test_repeat_prepare_returns_the_byte_identical_result(
    ledger_stub: ToolLedgerStub, result: pb.Payload
) -> None:
    """Once committed, a repeated prepare answers RETURN_RESULT with the
    result exactly as it was sent, byte for byte."""
    first = ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    assert first.attempt_held
    commit(ledger_stub, first.call.attempt, result)
    again = ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    assert again.decision == pb.DECISION_RETURN_RESULT
    assert not again.attempt_held
    assert again.call.state == pb.CALL_STATE_COMMITTED
    assert again.call.result.payload.SerializeToString() == result.SerializeToString()
    assert get(ledger_stub).result.payload == result


def test_repeat_commit_of_the_same_json_is_a_no_op(ledger_stub: ToolLedgerStub) -> None:
    """A repeated commit whose JSON differs only in spacing and key order has
    the same digest: it is accepted and the first text stands."""
    ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    first = commit(ledger_stub, 1, pb.Payload(json='{ "b":1,  "a":2 }'))
    again = commit(ledger_stub, 1, pb.Payload(json='{"a":2,"b":1}'))
    assert again.revision == first.revision
    assert again.result.payload.json == '{ "b":1,  "a":2 }'
    assert again.result.digest == first.result.digest


def test_commit_of_another_result_is_result_mismatch(
    ledger_stub: ToolLedgerStub,
) -> None:
    """A second commit with another result is RESULT_MISMATCH; the first
    result stands."""
    ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    first = commit(ledger_stub, 1, pb.Payload(json='{"n":1}'))
    expect_refusal(
        lambda: commit(ledger_stub, 1, pb.Payload(json='{"n":2}')),
        PRECONDITION,
        "RESULT_MISMATCH",
    )
    assert get(ledger_stub).result == first.result


@pytest.mark.parametrize(
    "repeat",
    [
        pytest.param(prepare_request(json='{"to":"b@c.d"}'), id="other-input"),
        pytest.param(prepare_request(json='{"to":"a@b.c","cc":null}'), id="extra-key"),
        pytest.param(
            prepare_request(json='{"to":"a@b.c"}', tool_name="other_tool"),
            id="other-tool",
        ),
        pytest.param(
            prepare_request(json='{"to":"a@b.c"}', effect=pb.EFFECT_READ),
            id="other-effect",
        ),
    ],
)
def test_prepare_with_other_input_is_input_mismatch(
    ledger_stub: ToolLedgerStub, repeat: pb.PrepareToolRequest
) -> None:
    """A repeated prepare of the same identity that differs in input, tool or
    effect is FAILED_PRECONDITION INPUT_MISMATCH and changes nothing."""
    ledger_stub.PrepareTool(prepare_request(json='{"to":"a@b.c"}'), timeout=5)
    first = get(ledger_stub)
    expect_refusal(
        lambda: ledger_stub.PrepareTool(repeat, timeout=5),
        PRECONDITION,
        "INPUT_MISMATCH",
    )
    assert get(ledger_stub) == first


def test_reordered_json_keys_have_one_fingerprint(ledger_stub: ToolLedgerStub) -> None:
    """JSON with reordered keys and other spacing is the same input: one
    fingerprint, the SHA-256 of its kind and its RFC 8785 form, and the
    repeat is accepted without a change."""
    first = ledger_stub.PrepareTool(
        prepare_request(json='{"b":[1,2.0,"x"],"a":{"y":1,"x":2}}'), timeout=5
    )
    again = ledger_stub.PrepareTool(
        prepare_request(json='{ "a": {"x": 2, "y": 1},\n "b": [1, 2, "x"] }'),
        timeout=5,
    )
    canonical = b'{"a":{"x":2,"y":1},"b":[1,2,"x"]}'
    tagged = b"effectd.input.json\x00" + canonical
    expected = "sha256:" + hashlib.sha256(tagged).hexdigest()
    assert first.call.input_fingerprint == again.call.input_fingerprint == expected
    assert again.call.revision == first.call.revision == 1


def test_raw_input_is_hashed_as_sent(ledger_stub: ToolLedgerStub) -> None:
    """Raw bytes are fingerprinted as sent, after their kind: other bytes
    are another input."""
    request = prepare_request()
    request.input.raw = b"\x01\x02"
    answer = ledger_stub.PrepareTool(request, timeout=5)
    tagged = b"effectd.input.raw\x00\x01\x02"
    expected = "sha256:" + hashlib.sha256(tagged).hexdigest()
    assert answer.call.input_fingerprint == expected
    request.input.raw = b"\x02\x01"
    expect_refusal(
        lambda: ledger_stub.PrepareTool(request, timeout=5),
        PRECONDITION,
        "INPUT_MISMATCH",
    )


# -- revisions, approval, unimplemented RPCs ----------------------------------


def test_stale_expected_revision_on_start_is_revision_conflict(
    ledger_stub: ToolLedgerStub,
) -> None:
    """StartTool with a stale expected_revision is ABORTED REVISION_CONFLICT
    carrying the current revision, and does not start the call."""
    ledger_stub.PrepareTool(prepare_request(), timeout=5)
    got = expect_refusal(
        lambda: start(ledger_stub, expected_revision=7),
        grpc.StatusCode.ABORTED,
        "REVISION_CONFLICT",
    )
    assert got.metadata["currentRevision"] == "1"
    assert get(ledger_stub).state == pb.CALL_STATE_PREPARED
    won = start(ledger_stub, expected_revision=1)
    assert won.decision == pb.DECISION_EXECUTE
    assert won.call.revision == 2
    got = expect_refusal(
        lambda: start(ledger_stub, expected_revision=1),
        grpc.StatusCode.ABORTED,
        "REVISION_CONFLICT",
    )
    assert got.metadata["currentRevision"] == "2"


def test_second_start_of_a_live_call_is_in_progress(
    ledger_stub: ToolLedgerStub,
) -> None:
    """While the first attempt's lease is live, another StartTool answers
    IN_PROGRESS and changes nothing."""
    ledger_stub.PrepareTool(prepare_request(), timeout=5)
    first = start(ledger_stub)
    second = start(ledger_stub)
    assert second.decision == pb.DECISION_IN_PROGRESS
    assert second.call.revision == first.call.revision
    assert second.call.attempt == 1


def test_required_approval_waits(ledger_stub: ToolLedgerStub) -> None:
    """A call that requires approval is AWAITING_APPROVAL with decision
    AWAIT_APPROVAL, and neither StartTool nor prepare-with-start starts it."""
    first = ledger_stub.PrepareTool(prepare_request(require_approval=True), timeout=5)
    assert first.decision == pb.DECISION_AWAIT_APPROVAL
    assert first.call.state == pb.CALL_STATE_AWAITING_APPROVAL
    assert first.call.approval_required
    started = start(ledger_stub)
    assert started.decision == pb.DECISION_AWAIT_APPROVAL
    again = ledger_stub.PrepareTool(
        prepare_request(require_approval=True, start=True), timeout=5
    )
    assert again.decision == pb.DECISION_AWAIT_APPROVAL
    assert not again.attempt_held
    call = get(ledger_stub)
    assert call.state == pb.CALL_STATE_AWAITING_APPROVAL
    assert (call.revision, call.attempt) == (1, 0)
    assert events(call) == ["prepare"]


@pytest.mark.parametrize("rpc", ["DecideApproval", "Reconcile"])
def test_bare_operator_requests_are_invalid(
    ledger_stub: ToolLedgerStub, rpc: str
) -> None:
    """DecideApproval and Reconcile without the approver's or operator's facts
    answer INVALID_ARGUMENT naming the missing fields, and change nothing."""
    ledger_stub.PrepareTool(prepare_request(require_approval=True), timeout=5)
    if rpc == "DecideApproval":
        got = refused(
            lambda: ledger_stub.DecideApproval(
                pb.DecideApprovalRequest(ref=ref(), approve=True, expected_revision=1),
                timeout=5,
            )
        )
        missing = {"approver", "reason", "input_fingerprint"}
    else:
        got = refused(
            lambda: ledger_stub.Reconcile(
                pb.ReconcileRequest(ref=ref(), expected_revision=1, not_executed=True),
                timeout=5,
            )
        )
        missing = {"operator", "reason", "evidence"}
    assert (got.code, got.domain, got.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        DOMAIN,
        "INVALID_REQUEST",
    )
    assert got.fields is not None
    assert set(got.fields) == missing
    assert get(ledger_stub).revision == 1


# -- idempotency keys ---------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "key"),
    [
        pytest.param(pb.EFFECT_IDEMPOTENT_WRITE, "run/7:call:3", id="idempotent-write"),
        pytest.param(pb.EFFECT_READ, "", id="read"),
        pytest.param(pb.EFFECT_SIDE_EFFECT, "", id="side-effect"),
        pytest.param(pb.EFFECT_UNSPECIFIED, "", id="unspecified-is-side-effect"),
    ],
)
def test_only_idempotent_writes_get_a_key(
    ledger_stub: ToolLedgerStub, effect: pb.Effect.ValueType, key: str
) -> None:
    """IDEMPOTENT_WRITE answers carry exactly `run_id:call_id` (scheme 1);
    READ and SIDE_EFFECT answers carry no key."""
    request = prepare_request("run/7", "call:3", effect=effect)
    prepared = ledger_stub.PrepareTool(request, timeout=5)
    assert prepared.idempotency_key == key
    assert prepared.call.key_scheme == 1
    started = start(ledger_stub, "run/7", "call:3")
    assert started.decision == pb.DECISION_EXECUTE
    assert started.idempotency_key == key
    ledger_stub.CommitTool(
        pb.CommitToolRequest(
            ref=ref("run/7", "call:3"),
            attempt=1,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK),
        ),
        timeout=5,
    )
    assert ledger_stub.PrepareTool(request, timeout=5).idempotency_key == key


def test_unspecified_effect_is_recorded_as_side_effect(
    ledger_stub: ToolLedgerStub,
) -> None:
    """An undeclared effect is recorded as SIDE_EFFECT (ADR-010 D2)."""
    answer = ledger_stub.PrepareTool(
        prepare_request(effect=pb.EFFECT_UNSPECIFIED), timeout=5
    )
    assert answer.call.effect == pb.EFFECT_SIDE_EFFECT


# -- leases on the manual clock -----------------------------------------------


def test_expired_side_effect_answers_reconcile(
    ledger_stub: ToolLedgerStub, clock: ManualClock
) -> None:
    """A side effect whose lease ran out is UNKNOWN: prepare answers
    RECONCILE and no start, not even an explicit retry, executes it."""
    ledger_stub.PrepareTool(prepare_request(start=True, lease_ms=1000), timeout=5)
    clock.advance(0.5)
    live = ledger_stub.PrepareTool(prepare_request(), timeout=5)
    assert live.decision == pb.DECISION_IN_PROGRESS
    clock.advance(0.5)
    expired = ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    assert expired.decision == pb.DECISION_RECONCILE
    assert not expired.attempt_held
    assert expired.call.state == pb.CALL_STATE_UNKNOWN
    assert events(expired.call) == ["prepare", "start", "expire"]
    for retry in (False, True):
        expect_refusal(
            lambda retry=retry: start(ledger_stub, retry=retry),  # type: ignore[misc]
            PRECONDITION,
            "RECONCILIATION_REQUIRED",
        )
    call = get(ledger_stub)
    assert (call.state, call.attempt) == (pb.CALL_STATE_UNKNOWN, 1)


@pytest.mark.parametrize("effect", [pb.EFFECT_READ, pb.EFFECT_IDEMPOTENT_WRITE])
def test_expired_retry_safe_call_needs_an_explicit_retry(
    ledger_stub: ToolLedgerStub, clock: ManualClock, effect: pb.Effect.ValueType
) -> None:
    """After a lease expiry a READ or IDEMPOTENT_WRITE prepare answers EXECUTE
    with retry_required, and a prepare with start is refused, asking for an
    explicit retry; only StartTool(retry) starts attempt 2, and attempt 1 can
    no longer commit (STALE_ATTEMPT)."""
    ledger_stub.PrepareTool(
        prepare_request(effect=effect, start=True, lease_ms=1000), timeout=5
    )
    clock.advance(2)
    prepared = ledger_stub.PrepareTool(prepare_request(effect=effect), timeout=5)
    assert prepared.decision == pb.DECISION_EXECUTE
    assert prepared.retry_required
    assert not prepared.attempt_held
    assert prepared.call.state == pb.CALL_STATE_UNKNOWN
    got = expect_refusal(
        lambda: ledger_stub.PrepareTool(
            prepare_request(effect=effect, start=True), timeout=5
        ),
        PRECONDITION,
        "INVALID_TRANSITION",
    )
    assert got.metadata["retryRequired"] == "true"
    expect_refusal(lambda: start(ledger_stub), PRECONDITION, "INVALID_TRANSITION")
    retried = start(ledger_stub, retry=True)
    assert retried.decision == pb.DECISION_EXECUTE
    assert (retried.call.state, retried.call.attempt) == (pb.CALL_STATE_STARTED, 2)
    got = expect_refusal(lambda: commit(ledger_stub, 1), PRECONDITION, "STALE_ATTEMPT")
    assert got.metadata["currentAttempt"] == "2"
    assert commit(ledger_stub, 2).state == pb.CALL_STATE_COMMITTED


def test_retries_stop_at_the_attempt_budget(
    ledger_stub: ToolLedgerStub, clock: ManualClock
) -> None:
    """A READ call is started at most 3 times; the next retry is
    ATTEMPTS_EXHAUSTED."""
    ledger_stub.PrepareTool(
        prepare_request(effect=pb.EFFECT_READ, start=True, lease_ms=1000), timeout=5
    )
    for attempt in (2, 3):
        clock.advance(2)
        assert start(ledger_stub, retry=True, lease_ms=1000).call.attempt == attempt
    clock.advance(2)
    expect_refusal(
        lambda: start(ledger_stub, retry=True), PRECONDITION, "ATTEMPTS_EXHAUSTED"
    )


def test_heartbeat_keeps_the_lease_alive(
    ledger_stub: ToolLedgerStub, clock: ManualClock
) -> None:
    """A heartbeat extends the lease past its original end, so the call stays
    IN_PROGRESS and its attempt can still commit; heartbeats are not history."""
    ledger_stub.PrepareTool(prepare_request(start=True, lease_ms=10_000), timeout=5)
    clock.advance(8)
    beat = ledger_stub.Heartbeat(
        pb.HeartbeatRequest(ref=ref(), attempt=1, lease_ms=10_000), timeout=5
    ).call
    assert beat.lease_expires_at.ToNanoseconds() == clock.wall_ns() + 10 * SECOND_NS
    clock.advance(8)  # 16 s after the start: past the original 10 s lease
    answer = ledger_stub.PrepareTool(prepare_request(), timeout=5)
    assert answer.decision == pb.DECISION_IN_PROGRESS
    assert answer.call.state == pb.CALL_STATE_STARTED
    committed = commit(ledger_stub, 1)
    assert committed.state == pb.CALL_STATE_COMMITTED
    assert events(committed) == ["prepare", "start", "commit"]


def test_without_heartbeat_the_same_lease_expires(
    ledger_stub: ToolLedgerStub, clock: ManualClock
) -> None:
    """Negative control of the heartbeat test: without the heartbeat, 16 s
    after the start the call is UNKNOWN and a heartbeat comes too late."""
    ledger_stub.PrepareTool(prepare_request(start=True, lease_ms=10_000), timeout=5)
    clock.advance(16)
    expect_refusal(
        lambda: ledger_stub.Heartbeat(
            pb.HeartbeatRequest(ref=ref(), attempt=1), timeout=5
        ),
        PRECONDITION,
        "INVALID_TRANSITION",
    )
    assert get(ledger_stub).state == pb.CALL_STATE_UNKNOWN


def test_heartbeat_answer_carries_the_history(ledger_stub: ToolLedgerStub) -> None:
    """The record in a Heartbeat answer has its history, as in every answer
    other than ListToolCalls."""
    ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    beat = ledger_stub.Heartbeat(pb.HeartbeatRequest(ref=ref(), attempt=1), timeout=5)
    assert events(beat.call) == ["prepare", "start"]


def test_heartbeat_from_another_attempt_is_stale(ledger_stub: ToolLedgerStub) -> None:
    """Only the attempt that holds the call may heartbeat it."""
    ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)
    expect_refusal(
        lambda: ledger_stub.Heartbeat(
            pb.HeartbeatRequest(ref=ref(), attempt=2), timeout=5
        ),
        PRECONDITION,
        "STALE_ATTEMPT",
    )


# -- report unknown -----------------------------------------------------------


def test_report_unknown_makes_a_side_effect_reconcile(
    ledger_stub: ToolLedgerStub,
) -> None:
    """ReportUnknown turns STARTED into UNKNOWN with the reason in the history;
    a side effect then answers RECONCILE, and a repeat is a no-op."""
    ledger_stub.PrepareTool(prepare_request(start=True), timeout=5)

    def report(attempt: int) -> pb.ToolCall:
        request = pb.ReportUnknownRequest(
            ref=ref(), attempt=attempt, reason="timeout after 30 s"
        )
        return ledger_stub.ReportUnknown(request, timeout=5).call

    expect_refusal(lambda: report(2), PRECONDITION, "STALE_ATTEMPT")
    unknown = report(1)
    assert unknown.state == pb.CALL_STATE_UNKNOWN
    assert unknown.history[-1].event == "report_unknown"
    assert unknown.history[-1].reason == "timeout after 30 s"
    assert report(1).revision == unknown.revision
    answer = ledger_stub.PrepareTool(prepare_request(), timeout=5)
    assert answer.decision == pb.DECISION_RECONCILE


def test_report_unknown_of_a_read_allows_a_retry(ledger_stub: ToolLedgerStub) -> None:
    """A READ reported unknown answers EXECUTE with retry_required."""
    request = prepare_request(effect=pb.EFFECT_READ, start=True)
    ledger_stub.PrepareTool(request, timeout=5)
    ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="connection lost"),
        timeout=5,
    )
    answer = ledger_stub.PrepareTool(prepare_request(effect=pb.EFFECT_READ), timeout=5)
    assert (answer.decision, answer.retry_required) == (pb.DECISION_EXECUTE, True)


@pytest.mark.parametrize("effect", [pb.EFFECT_READ, pb.EFFECT_IDEMPOTENT_WRITE])
def test_prepare_with_start_and_retry_holds_the_retry(
    ledger_stub: ToolLedgerStub, effect: pb.Effect.ValueType
) -> None:
    """PrepareTool(start, retry) of an UNKNOWN READ or IDEMPOTENT_WRITE holds
    attempt 2 in one round trip (EXECUTE with attempt_held), PrepareTools the
    same; then attempt 1's commit is STALE_ATTEMPT (issue 10 item 9: fails
    before the fix: EXECUTE came back without the attempt, and attempt 1's
    commit was accepted)."""
    for call_id in ("one", "batch"):
        request = prepare_request(call_id=call_id, effect=effect, start=True)
        ledger_stub.PrepareTool(request, timeout=5)
        ledger_stub.ReportUnknown(
            pb.ReportUnknownRequest(ref=ref(call_id=call_id), attempt=1), timeout=5
        )
        request.retry = True
        if call_id == "one":
            answer = ledger_stub.PrepareTool(request, timeout=5)
        else:
            [answer] = ledger_stub.PrepareTools(
                pb.PrepareToolsRequest(calls=[request]), timeout=5
            ).results
        assert (answer.decision, answer.attempt_held) == (pb.DECISION_EXECUTE, True)
        assert (answer.call.state, answer.call.attempt) == (pb.CALL_STATE_STARTED, 2)
        assert answer.call.history[-1].event == "retry"
        expect_refusal(
            lambda call_id=call_id: commit(ledger_stub, 1, call_id=call_id),  # type: ignore[misc]
            PRECONDITION,
            "STALE_ATTEMPT",
        )


# -- batches ------------------------------------------------------------------


def test_prepare_tools_answers_a_batch_in_order(ledger_stub: ToolLedgerStub) -> None:
    """PrepareTools records and starts 3 calls in one request, answering in
    request order; an already committed call in the batch returns its result."""
    ledger_stub.PrepareTool(prepare_request("run", "done", start=True), timeout=5)
    commit(ledger_stub, 1, pb.Payload(json='{"cached":true}'), call_id="done")
    calls = [
        prepare_request("run", "b", effect=pb.EFFECT_READ, start=True),
        prepare_request("run", "done", start=True),
        prepare_request("run", "a", effect=pb.EFFECT_IDEMPOTENT_WRITE, start=True),
    ]
    answer = ledger_stub.PrepareTools(pb.PrepareToolsRequest(calls=calls), timeout=5)
    got = [
        (r.call.ref.call_id, r.decision, r.attempt_held, r.idempotency_key)
        for r in answer.results
    ]
    assert got == [
        ("b", pb.DECISION_EXECUTE, True, ""),
        ("done", pb.DECISION_RETURN_RESULT, False, ""),
        ("a", pb.DECISION_EXECUTE, True, "run:a"),
    ]
    assert answer.results[1].call.result.payload.json == '{"cached":true}'
    assert get(ledger_stub, "run", "a").state == pb.CALL_STATE_STARTED


def test_batch_with_one_mismatch_writes_nothing(ledger_stub: ToolLedgerStub) -> None:
    """A batch whose second call mismatches is INPUT_MISMATCH with index 1 in
    the ErrorInfo metadata, and none of its calls is recorded or started."""
    ledger_stub.PrepareTool(prepare_request("run", "x", json='{"v":1}'), timeout=5)
    existing = get(ledger_stub, "run", "x")
    calls = [
        prepare_request("run", "new-1", start=True),
        prepare_request("run", "x", json='{"v":2}', start=True),
        prepare_request("run", "new-2", start=True),
    ]
    got = expect_refusal(
        lambda: ledger_stub.PrepareTools(
            pb.PrepareToolsRequest(calls=calls), timeout=5
        ),
        PRECONDITION,
        "INPUT_MISMATCH",
    )
    assert got.metadata["index"] == "1"
    for call_id in ("new-1", "new-2"):
        expect_refusal(
            lambda call_id=call_id: get(ledger_stub, "run", call_id),  # type: ignore[misc]
            grpc.StatusCode.NOT_FOUND,
            "NOT_FOUND",
        )
    assert get(ledger_stub, "run", "x") == existing


# -- namespaces ---------------------------------------------------------------


def _call_on(stub: ToolLedgerStub, rpc: str, other: pb.CallRef) -> object:
    """Sends `rpc` for the call `other`, with an attempt where one is needed."""
    match rpc:
        case "GetToolCall":
            return stub.GetToolCall(pb.GetToolCallRequest(ref=other), timeout=5)
        case "StartTool":
            return stub.StartTool(pb.StartToolRequest(ref=other), timeout=5)
        case "CommitTool":
            result = pb.ToolResult(outcome=pb.OUTCOME_OK)
            return stub.CommitTool(
                pb.CommitToolRequest(ref=other, attempt=1, result=result), timeout=5
            )
        case "Heartbeat":
            return stub.Heartbeat(pb.HeartbeatRequest(ref=other, attempt=1), timeout=5)
        case "ReportUnknown":
            return stub.ReportUnknown(
                pb.ReportUnknownRequest(ref=other, attempt=1), timeout=5
            )
    raise AssertionError(rpc)


@pytest.mark.parametrize(
    "rpc", ["GetToolCall", "StartTool", "CommitTool", "Heartbeat", "ReportUnknown"]
)
def test_a_call_of_another_namespace_is_not_found(
    ledger_stub: ToolLedgerStub, rpc: str
) -> None:
    """Every RPC on a call recorded in namespace tenant-a answers NOT_FOUND
    from tenant-b (and from the default namespace), and changes nothing."""
    ledger_stub.PrepareTool(
        prepare_request(namespace="tenant-a", start=True), timeout=5
    )
    recorded = get(ledger_stub, ns="tenant-a")
    for ns in ("tenant-b", ""):
        other = ref(namespace=ns)
        expect_refusal(
            lambda other=other: _call_on(ledger_stub, rpc, other),  # type: ignore[misc]
            grpc.StatusCode.NOT_FOUND,
            "NOT_FOUND",
        )
    assert get(ledger_stub, ns="tenant-a") == recorded


def test_one_identity_in_two_namespaces_is_two_calls(
    ledger_stub: ToolLedgerStub,
) -> None:
    """The same run and call ids in two namespaces are independent records:
    other input in the second namespace is no INPUT_MISMATCH."""
    a = ledger_stub.PrepareTool(
        prepare_request(namespace="a", json='{"n":1}', start=True), timeout=5
    )
    b = ledger_stub.PrepareTool(
        prepare_request(namespace="b", json='{"n":2}'), timeout=5
    )
    assert a.decision == b.decision == pb.DECISION_EXECUTE
    assert a.call.input_fingerprint != b.call.input_fingerprint
    assert get(ledger_stub, ns="a").state == pb.CALL_STATE_STARTED
    assert get(ledger_stub, ns="b").state == pb.CALL_STATE_PREPARED


def _list(
    stub: ToolLedgerStub,
    *,
    ns: str = "",
    run_id: str = "",
    states: tuple[pb.CallState.ValueType, ...] = (),
    page_size: int = 0,
) -> list[list[tuple[str, str]]]:
    """Every page of a listing, as (run_id, call_id) pairs."""
    pages: list[list[tuple[str, str]]] = []
    token = ""
    while True:
        request = pb.ListToolCallsRequest(
            namespace=ns,
            run_id=run_id,
            states=list(states),
            page_size=page_size,
            page_token=token,
        )
        page = stub.ListToolCalls(request, timeout=5)
        assert all(len(c.history) == 0 for c in page.calls)
        assert all(c.ref.namespace == (ns or "default") for c in page.calls)
        pages.append([(c.ref.run_id, c.ref.call_id) for c in page.calls])
        token = page.next_page_token
        if not token:
            return pages


def test_list_filters_by_run_and_state_and_paginates(
    ledger_stub: ToolLedgerStub,
) -> None:
    """ListToolCalls filters by run (r1 is not r10) and by state, pages in key
    order, and never shows calls of another namespace."""
    for run_id, call_id, ns in [
        ("r1", "c3", ""),
        ("r1", "c1", ""),
        ("r10", "c1", ""),
        ("r1", "c2", ""),
        ("r2", "c1", ""),
        ("r1", "c4", ""),
        ("r1", "c5", ""),
        ("r1", "c9", "other"),
        ("r1", "c1", "other"),
    ]:
        ledger_stub.PrepareTool(
            prepare_request(run_id, call_id, namespace=ns), timeout=5
        )
    for call_id in ("c2", "c4"):
        start(ledger_stub, "r1", call_id)
    commit(ledger_stub, 1, run_id="r1", call_id="c4")
    start(ledger_stub, "r2", "c1")
    r1 = [("r1", f"c{i}") for i in range(1, 6)]
    assert _list(ledger_stub, run_id="r1") == [r1]
    assert _list(ledger_stub, run_id="r1", page_size=2) == [r1[0:2], r1[2:4], r1[4:]]
    assert _list(ledger_stub, states=(pb.CALL_STATE_STARTED,)) == [
        [("r1", "c2"), ("r2", "c1")]
    ]
    assert _list(
        ledger_stub,
        run_id="r1",
        states=(pb.CALL_STATE_STARTED, pb.CALL_STATE_COMMITTED),
    ) == [[("r1", "c2"), ("r1", "c4")]]
    everything = [pair for page in _list(ledger_stub, page_size=3) for pair in page]
    assert everything == [*r1, ("r10", "c1"), ("r2", "c1")]
    assert _list(ledger_stub, ns="other") == [[("r1", "c1"), ("r1", "c9")]]
    assert _list(ledger_stub, ns="nobody") == [[]]


def test_page_token_of_another_namespace_is_refused(
    ledger_stub: ToolLedgerStub,
) -> None:
    """A page token from a listing of namespace a is INVALID_ARGUMENT in b:
    it cannot be used to read past b's own keys."""
    for i in range(3):
        ledger_stub.PrepareTool(prepare_request("r", f"c{i}", namespace="a"), timeout=5)
    ledger_stub.PrepareTool(prepare_request("r", "c9", namespace="b"), timeout=5)
    token = ledger_stub.ListToolCalls(
        pb.ListToolCallsRequest(namespace="a", page_size=1), timeout=5
    ).next_page_token
    assert token
    got = expect_refusal(
        lambda: ledger_stub.ListToolCalls(
            pb.ListToolCallsRequest(namespace="b", page_token=token), timeout=5
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert got.fields == ("page_token",)


def _list_all_namespaces(
    stub: ToolLedgerStub, *, run_id: str = "", page_size: int = 0
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Every page of a listing of every namespace, as (namespace, run_id,
    call_id), and the namespaces searched."""
    calls: list[tuple[str, str, str]] = []
    searched: list[str] = []
    token = ""
    while True:
        page = stub.ListToolCalls(
            pb.ListToolCallsRequest(
                all_namespaces=True,
                run_id=run_id,
                page_size=page_size,
                page_token=token,
            ),
            timeout=5,
        )
        calls.extend((c.ref.namespace, c.ref.run_id, c.ref.call_id) for c in page.calls)
        searched = list(page.searched_namespaces)
        token = page.next_page_token
        if not token:
            return calls, searched


def test_list_of_every_namespace_pages_across_namespaces_in_key_order(
    ledger_stub: ToolLedgerStub, checkpoints_stub: CheckpointsStub
) -> None:
    """Without authentication, all_namespaces lists the calls of every
    namespace the store holds, namespace after namespace ("a" before "a.b"
    before "b"), across page boundaries and with a run filter, and names the
    namespaces searched (issue 10 item 30: fails before the fix: the request
    had no all_namespaces)."""
    made = [
        ("b", "r1", "c1"),
        ("a", "r1", "c2"),
        ("a.b", "r1", "c1"),
        ("a", "r1", "c1"),
        ("a", "r2", "c1"),
        ("default", "r1", "c1"),
    ]
    for ns, run_id, call_id in made:
        ledger_stub.PrepareTool(
            prepare_request(run_id, call_id, namespace=ns), timeout=5
        )
    # A namespace holding only a checkpoint is searched and has no calls.
    checkpoints_stub.Put(
        cpb.PutCheckpointRequest(namespace="c", key="k", expect_absent=True),
        timeout=5,
    )
    everything = sorted(made)
    names = ["a", "a.b", "b", "c", "default"]
    for size in (1, 2, 100):
        assert _list_all_namespaces(ledger_stub, page_size=size) == (everything, names)
    r1 = [c for c in everything if c[1] == "r1"]
    assert _list_all_namespaces(ledger_stub, run_id="r1", page_size=1) == (r1, names)
    got = expect_refusal(
        lambda: ledger_stub.ListToolCalls(
            pb.ListToolCallsRequest(namespace="a", all_namespaces=True), timeout=5
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )
    assert got.fields == ("namespace",)
    # One namespace: it is the one searched.
    one = ledger_stub.ListToolCalls(pb.ListToolCallsRequest(namespace="b"), timeout=5)
    assert list(one.searched_namespaces) == ["b"]


def test_history_records_every_transition_in_order(
    ledger_stub: ToolLedgerStub, clock: ManualClock
) -> None:
    """GetToolCall returns the history oldest first: each transition's event,
    states, actor, revision, attempt and time."""
    t0 = clock.wall_ns()
    request = prepare_request(effect=pb.EFFECT_READ, start=True, lease_ms=1000)
    ledger_stub.PrepareTool(request, timeout=5)
    clock.advance(2)
    start(ledger_stub, retry=True)
    clock.advance(1)
    commit(ledger_stub, 2)
    call = get(ledger_stub)
    s = pb.CallState
    got = [
        (
            t.event,
            s.Name(t.from_state),
            s.Name(t.to_state),
            t.actor,
            t.revision,
            t.attempt,
            t.at.ToNanoseconds() - t0,
        )
        for t in call.history
    ]
    assert got == [
        ("prepare", "CALL_STATE_UNSPECIFIED", "CALL_STATE_PREPARED", "agent", 1, 0, 0),
        ("start", "CALL_STATE_PREPARED", "CALL_STATE_STARTED", "agent", 2, 1, 0),
        (
            "expire",
            "CALL_STATE_STARTED",
            "CALL_STATE_UNKNOWN",
            "effectd",
            3,
            1,
            2 * SECOND_NS,
        ),
        (
            "retry",
            "CALL_STATE_UNKNOWN",
            "CALL_STATE_STARTED",
            "agent",
            4,
            2,
            2 * SECOND_NS,
        ),
        (
            "commit",
            "CALL_STATE_STARTED",
            "CALL_STATE_COMMITTED",
            "agent",
            5,
            2,
            3 * SECOND_NS,
        ),
    ]
    assert call.revision == 5
    assert call.history[2].reason == "lease expired"


def test_client_reads_the_same_history(client: Client) -> None:
    """The typed client sees the history's events in order too."""
    client.prepare_tool("run", "call", "t", {"q": 1}, effect=Effect.READ, start=True)
    client.commit_tool("run", "call", 1, {"a": 1})
    assert client.get_tool_call("run", "call").history == ("prepare", "start", "commit")


def test_a_batch_retry_past_the_budget_writes_nothing(
    short_tmp: Path, clock: ManualClock
) -> None:
    """Under a budget of one attempt, PrepareTool(start, retry) of an UNKNOWN
    READ is refused ATTEMPTS_EXHAUSTED; in a PrepareTools batch the refusal
    names its index and the batch writes nothing (issue 10 item 9: fails
    before the fix: EXECUTE came back, ignoring the budget)."""
    policy = short_tmp / "policy.toml"
    policy.write_text("[retry]\nmax_attempts = 1\n")
    config = ServeConfig(data_dir=short_tmp / "budget", policy_file=policy)
    with (
        running_daemon(config, clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        stub = ToolLedgerStub(channel)
        request = prepare_request(effect=pb.EFFECT_READ, start=True)
        stub.PrepareTool(request, timeout=5)
        stub.ReportUnknown(pb.ReportUnknownRequest(ref=ref(), attempt=1), timeout=5)
        request.retry = True
        got = expect_refusal(
            lambda: stub.PrepareTool(request, timeout=5),
            PRECONDITION,
            "ATTEMPTS_EXHAUSTED",
        )
        assert got.metadata == {"attempts": "1", "maxAttempts": "1"}
        fresh = prepare_request(call_id="fresh", start=True)
        batch = pb.PrepareToolsRequest(calls=[fresh, request])
        got = expect_refusal(
            lambda: stub.PrepareTools(batch, timeout=5),
            PRECONDITION,
            "ATTEMPTS_EXHAUSTED",
        )
        assert got.metadata["index"] == "1"
        missing = refused(
            lambda: stub.GetToolCall(
                pb.GetToolCallRequest(ref=ref(call_id="fresh")), timeout=5
            )
        )
        assert missing.code is grpc.StatusCode.NOT_FOUND
