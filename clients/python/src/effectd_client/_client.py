"""The synchronous client: one method per RPC, typed values in and out."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import checkpoints_pb2_grpc, ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from effectd_client._errors import EffectdError
from effectd_client._types import (
    Checkpoint,
    Decision,
    Effect,
    Prepared,
    RecoveryPlan,
    State,
    ToolCall,
)

T = TypeVar("T")


def _payload(value: Any) -> pb.Payload:
    """bytes are sent raw; anything else as JSON text."""
    if isinstance(value, bytes | bytearray):
        return pb.Payload(raw=bytes(value))
    return pb.Payload(json=json.dumps(value, separators=(",", ":"), ensure_ascii=False))


class Client:
    """A connection to effectd (`unix:PATH` or `HOST:PORT`)."""

    def __init__(
        self,
        target: str = "unix:.effectd/effectd.sock",
        *,
        namespace: str = "",
        timeout: float = 10.0,
    ) -> None:
        self.namespace = namespace
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target)
        self._ledger = ledger_pb2_grpc.ToolLedgerStub(self._channel)
        self._checkpoints = checkpoints_pb2_grpc.CheckpointsStub(self._channel)
        self._recovery = recovery_pb2_grpc.RecoveryStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., T], request: object) -> T:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise EffectdError.from_rpc_error(exc) from None

    def _ref(self, run_id: str, call_id: str) -> pb.CallRef:
        return pb.CallRef(namespace=self.namespace, run_id=run_id, call_id=call_id)

    # -- tool calls ----------------------------------------------------------

    def prepare_tool(
        self,
        run_id: str,
        call_id: str,
        tool_name: str,
        input: Any,
        *,
        effect: Effect = Effect.SIDE_EFFECT,
        require_approval: bool = False,
        start: bool = False,
        lease_ms: int = 0,
    ) -> Prepared:
        """Records the call (or finds it) and returns the decision."""
        request = pb.PrepareToolRequest(
            ref=self._ref(run_id, call_id),
            tool_name=tool_name,
            effect=effect.value,
            input=_payload(input),
            require_approval=require_approval,
            start=start,
            lease_ms=lease_ms,
        )
        r = self._call(self._ledger.PrepareTool, request)
        return Prepared(
            Decision(r.decision),
            ToolCall.from_pb(r.call),
            r.idempotency_key,
            r.attempt_held,
            r.retry_required,
        )

    def start_tool(
        self,
        run_id: str,
        call_id: str,
        *,
        retry: bool = False,
        lease_ms: int = 0,
        expected_revision: int | None = None,
    ) -> Prepared:
        request = pb.StartToolRequest(
            ref=self._ref(run_id, call_id),
            retry=retry,
            lease_ms=lease_ms,
            expected_revision=expected_revision,
        )
        r = self._call(self._ledger.StartTool, request)
        held = r.decision == pb.DECISION_EXECUTE
        return Prepared(
            Decision(r.decision),
            ToolCall.from_pb(r.call),
            r.idempotency_key,
            held,
            False,
        )

    def commit_tool(
        self,
        run_id: str,
        call_id: str,
        attempt: int,
        result: Any = None,
        *,
        error_code: str = "",
        error_message: str = "",
    ) -> ToolCall:
        """Commits the result; with `error_code`, an error result."""
        outcome = pb.OUTCOME_ERROR if error_code else pb.OUTCOME_OK
        payload = None if result is None and error_code else _payload(result)
        request = pb.CommitToolRequest(
            ref=self._ref(run_id, call_id),
            attempt=attempt,
            result=pb.ToolResult(
                outcome=outcome,
                payload=payload,
                error_code=error_code,
                error_message=error_message,
            ),
        )
        return ToolCall.from_pb(self._call(self._ledger.CommitTool, request).call)

    def report_unknown(
        self, run_id: str, call_id: str, attempt: int, reason: str
    ) -> ToolCall:
        request = pb.ReportUnknownRequest(
            ref=self._ref(run_id, call_id), attempt=attempt, reason=reason
        )
        return ToolCall.from_pb(self._call(self._ledger.ReportUnknown, request).call)

    def heartbeat(
        self, run_id: str, call_id: str, attempt: int, lease_ms: int = 0
    ) -> ToolCall:
        request = pb.HeartbeatRequest(
            ref=self._ref(run_id, call_id), attempt=attempt, lease_ms=lease_ms
        )
        return ToolCall.from_pb(self._call(self._ledger.Heartbeat, request).call)

    def get_tool_call(self, run_id: str, call_id: str) -> ToolCall:
        request = pb.GetToolCallRequest(ref=self._ref(run_id, call_id))
        return ToolCall.from_pb(self._call(self._ledger.GetToolCall, request).call)

    def list_tool_calls(
        self, run_id: str = "", states: tuple[State, ...] = (), page_size: int = 0
    ) -> Iterator[ToolCall]:
        """Every matching call, following page tokens."""
        token = ""
        while True:
            request = pb.ListToolCallsRequest(
                namespace=self.namespace,
                run_id=run_id,
                states=[s.value for s in states],
                page_size=page_size,
                page_token=token,
            )
            page = self._call(self._ledger.ListToolCalls, request)
            yield from (ToolCall.from_pb(c) for c in page.calls)
            token = page.next_page_token
            if not token:
                return

    # -- approvals, reconciliation, recovery ---------------------------------

    def decide_approval(
        self,
        run_id: str,
        call_id: str,
        *,
        approve: bool,
        approver: str,
        reason: str,
        expected_revision: int,
        input_fingerprint: str,
    ) -> ToolCall:
        """Approves or rejects the call as seen at `expected_revision`."""
        request = pb.DecideApprovalRequest(
            ref=self._ref(run_id, call_id),
            approve=approve,
            approver=approver,
            reason=reason,
            expected_revision=expected_revision,
            input_fingerprint=input_fingerprint,
        )
        return ToolCall.from_pb(self._call(self._ledger.DecideApproval, request).call)

    def reconcile(
        self,
        run_id: str,
        call_id: str,
        *,
        expected_revision: int,
        operator: str,
        reason: str,
        evidence: str,
        result: Any = None,
        not_executed: bool = False,
    ) -> ToolCall:
        """Resolves an unknown outcome: the result found, or never executed."""
        request = pb.ReconcileRequest(
            ref=self._ref(run_id, call_id),
            expected_revision=expected_revision,
            operator=operator,
            reason=reason,
            evidence=evidence,
        )
        if not_executed:
            request.not_executed = True
        else:
            request.result.CopyFrom(
                pb.ToolResult(outcome=pb.OUTCOME_OK, payload=_payload(result))
            )
        return ToolCall.from_pb(self._call(self._ledger.Reconcile, request).call)

    def recover(self, run_id: str) -> RecoveryPlan:
        """The plan for every call of a crashed run."""
        request = rpb.RecoverRequest(namespace=self.namespace, run_id=run_id)
        return RecoveryPlan.from_pb(self._call(self._recovery.Recover, request))

    def acknowledge_recovery(self, run_id: str, call_ids: list[str]) -> None:
        """Marks replayed results as delivered to the transcript."""
        request = rpb.AcknowledgeRecoveryRequest(
            namespace=self.namespace, run_id=run_id, call_ids=call_ids
        )
        self._call(self._recovery.AcknowledgeRecovery, request)

    # -- checkpoints ---------------------------------------------------------

    def get_checkpoint(self, key: str) -> Checkpoint | None:
        try:
            r = self._call(
                self._checkpoints.Get,
                cpb.GetCheckpointRequest(namespace=self.namespace, key=key),
            )
        except EffectdError as exc:
            if exc.reason == "NOT_FOUND":
                return None
            raise
        return Checkpoint.from_pb(r.checkpoint)

    def put_checkpoint(
        self, key: str, value: bytes, *, expected_revision: int | None = None
    ) -> int:
        """Writes `key` if it is at `expected_revision`, or absent when None."""
        request = cpb.PutCheckpointRequest(
            namespace=self.namespace, key=key, value=value
        )
        if expected_revision is None:
            request.expect_absent = True
        else:
            request.expected_revision = expected_revision
        return self._call(self._checkpoints.Put, request).revision

    def delete_checkpoint(self, key: str, expected_revision: int) -> None:
        request = cpb.DeleteCheckpointRequest(
            namespace=self.namespace, key=key, expected_revision=expected_revision
        )
        self._call(self._checkpoints.Delete, request)

    def list_checkpoints(
        self, prefix: str = "", *, keys_only: bool = False
    ) -> Iterator[Checkpoint]:
        token = ""
        while True:
            request = cpb.ListCheckpointsRequest(
                namespace=self.namespace,
                prefix=prefix,
                page_token=token,
                keys_only=keys_only,
            )
            page = self._call(self._checkpoints.List, request)
            yield from (Checkpoint.from_pb(c) for c in page.checkpoints)
            token = page.next_page_token
            if not token:
                return
