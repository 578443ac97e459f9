"""Request building and answer conversion, shared by `Client` and `AsyncClient`.

Each RPC has one builder here (typed values in, a request message out) and,
where the answer is more than a `ToolCall`, one converter (a response message
in, a frozen dataclass out). The two clients only add the transport.
"""

from __future__ import annotations

import json
from typing import Any

from effectd.v1 import admin_pb2 as apb
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from effectd_client._types import (
    Channel,
    Decision,
    Effect,
    Prepared,
    State,
    ToolCall,
)


def payload(value: Any) -> pb.Payload:
    """bytes are sent raw; anything else as JSON text."""
    if isinstance(value, bytes | bytearray):
        return pb.Payload(raw=bytes(value))
    return pb.Payload(json=json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def ref(namespace: str, run_id: str, call_id: str) -> pb.CallRef:
    return pb.CallRef(namespace=namespace, run_id=run_id, call_id=call_id)


# -- tool calls --------------------------------------------------------------


def prepare_tool(
    namespace: str,
    run_id: str,
    call_id: str,
    tool_name: str,
    input: Any,
    *,
    effect: Effect,
    require_approval: bool,
    start: bool,
    lease_ms: int,
    retry: bool = False,
    channel: Channel = Channel.TOOL,
) -> pb.PrepareToolRequest:
    return pb.PrepareToolRequest(
        ref=ref(namespace, run_id, call_id),
        tool_name=tool_name,
        effect=effect.value,
        input=payload(input),
        require_approval=require_approval,
        start=start,
        lease_ms=lease_ms,
        retry=retry,
        channel=channel.value,
    )


def prepared(r: pb.PrepareToolResponse) -> Prepared:
    return Prepared(
        Decision(r.decision),
        ToolCall.from_pb(r.call),
        r.idempotency_key,
        r.attempt_held,
        r.retry_required,
    )


def start_tool(
    namespace: str,
    run_id: str,
    call_id: str,
    *,
    retry: bool,
    lease_ms: int,
    expected_revision: int | None,
) -> pb.StartToolRequest:
    return pb.StartToolRequest(
        ref=ref(namespace, run_id, call_id),
        retry=retry,
        lease_ms=lease_ms,
        expected_revision=expected_revision,
    )


def started(r: pb.StartToolResponse) -> Prepared:
    # Only a StartTool that answers EXECUTE holds the attempt (contract §5.2).
    held = r.decision == pb.DECISION_EXECUTE
    return Prepared(
        Decision(r.decision), ToolCall.from_pb(r.call), r.idempotency_key, held, False
    )


def commit_tool(
    namespace: str,
    run_id: str,
    call_id: str,
    attempt: int,
    result: Any,
    *,
    error_code: str,
    error_message: str,
    acknowledge: bool = False,
) -> pb.CommitToolRequest:
    outcome = pb.OUTCOME_ERROR if error_code else pb.OUTCOME_OK
    body = None if result is None and error_code else payload(result)
    return pb.CommitToolRequest(
        ref=ref(namespace, run_id, call_id),
        attempt=attempt,
        result=pb.ToolResult(
            outcome=outcome,
            payload=body,
            error_code=error_code,
            error_message=error_message,
        ),
        acknowledge=acknowledge,
    )


def report_unknown(
    namespace: str, run_id: str, call_id: str, attempt: int, reason: str
) -> pb.ReportUnknownRequest:
    return pb.ReportUnknownRequest(
        ref=ref(namespace, run_id, call_id), attempt=attempt, reason=reason
    )


def heartbeat(
    namespace: str, run_id: str, call_id: str, attempt: int, lease_ms: int
) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(
        ref=ref(namespace, run_id, call_id), attempt=attempt, lease_ms=lease_ms
    )


def get_tool_call(namespace: str, run_id: str, call_id: str) -> pb.GetToolCallRequest:
    return pb.GetToolCallRequest(ref=ref(namespace, run_id, call_id))


def list_tool_calls(
    namespace: str,
    run_id: str,
    states: tuple[State, ...],
    page_size: int,
    page_token: str,
    *,
    all_namespaces: bool = False,
) -> pb.ListToolCallsRequest:
    return pb.ListToolCallsRequest(
        # Every namespace the caller may see, so none is named.
        namespace="" if all_namespaces else namespace,
        run_id=run_id,
        states=[s.value for s in states],
        page_size=page_size,
        page_token=page_token,
        all_namespaces=all_namespaces,
    )


# -- approvals, reconciliation, recovery -------------------------------------


def decide_approval(
    namespace: str,
    run_id: str,
    call_id: str,
    *,
    approve: bool,
    approver: str,
    reason: str,
    expected_revision: int,
    input_fingerprint: str,
) -> pb.DecideApprovalRequest:
    return pb.DecideApprovalRequest(
        ref=ref(namespace, run_id, call_id),
        approve=approve,
        approver=approver,
        reason=reason,
        expected_revision=expected_revision,
        input_fingerprint=input_fingerprint,
    )


def reconcile(
    namespace: str,
    run_id: str,
    call_id: str,
    *,
    expected_revision: int,
    operator: str,
    reason: str,
    evidence: str,
    result: Any,
    not_executed: bool,
    confirmed_dead_attempt: int = 0,
) -> pb.ReconcileRequest:
    request = pb.ReconcileRequest(
        ref=ref(namespace, run_id, call_id),
        expected_revision=expected_revision,
        operator=operator,
        reason=reason,
        evidence=evidence,
        confirmed_dead_attempt=confirmed_dead_attempt,
    )
    if not_executed:
        request.not_executed = True
    else:
        request.result.CopyFrom(
            pb.ToolResult(outcome=pb.OUTCOME_OK, payload=payload(result))
        )
    return request


# Calls per Recover answer when a plan is read page by page (the most the
# daemon answers at once).
RECOVER_PAGE_SIZE = 1000


def recover(
    namespace: str, run_id: str, page_size: int = 0, page_token: str = ""
) -> rpb.RecoverRequest:
    return rpb.RecoverRequest(
        namespace=namespace, run_id=run_id, page_size=page_size, page_token=page_token
    )


def acknowledge_recovery(
    namespace: str, run_id: str, call_ids: list[str]
) -> rpb.AcknowledgeRecoveryRequest:
    return rpb.AcknowledgeRecoveryRequest(
        namespace=namespace, run_id=run_id, call_ids=call_ids
    )


# -- checkpoints -------------------------------------------------------------


def get_checkpoint(namespace: str, key: str) -> cpb.GetCheckpointRequest:
    return cpb.GetCheckpointRequest(namespace=namespace, key=key)


def put_checkpoint(
    namespace: str, key: str, value: bytes, expected_revision: int | None
) -> cpb.PutCheckpointRequest:
    """`expected_revision` None means the key must be absent."""
    request = cpb.PutCheckpointRequest(namespace=namespace, key=key, value=value)
    if expected_revision is None:
        request.expect_absent = True
    else:
        request.expected_revision = expected_revision
    return request


def delete_checkpoint(
    namespace: str, key: str, expected_revision: int
) -> cpb.DeleteCheckpointRequest:
    return cpb.DeleteCheckpointRequest(
        namespace=namespace, key=key, expected_revision=expected_revision
    )


def list_checkpoints(
    namespace: str, prefix: str, keys_only: bool, page_token: str
) -> cpb.ListCheckpointsRequest:
    return cpb.ListCheckpointsRequest(
        namespace=namespace, prefix=prefix, page_token=page_token, keys_only=keys_only
    )


# -- the Admin service -------------------------------------------------------


def verify_audit() -> apb.VerifyAuditRequest:
    return apb.VerifyAuditRequest()


def list_audit(
    namespace: str, newest_first: bool, page_size: int, page_token: str
) -> apb.ListAuditRequest:
    return apb.ListAuditRequest(
        namespace=namespace,
        newest_first=newest_first,
        page_size=page_size,
        page_token=page_token,
    )


def reload_policy(reason: str) -> apb.ReloadPolicyRequest:
    return apb.ReloadPolicyRequest(reason=reason)


def backup(path: str) -> apb.BackupRequest:
    return apb.BackupRequest(path=path)


def get_stats(namespace: str) -> apb.GetStatsRequest:
    return apb.GetStatsRequest(namespace=namespace)


def enter_reconciliation(
    namespace: str, tool_name: str, *, reason: str, operator: str
) -> apb.EnterReconciliationRequest:
    return apb.EnterReconciliationRequest(
        tool_name=tool_name, namespace=namespace, reason=reason, operator=operator
    )


def list_daemons() -> apb.ListDaemonsRequest:
    return apb.ListDaemonsRequest()
