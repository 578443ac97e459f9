"""Helpers for the RPC tests: decode rich refusals, prove the daemon serves."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

DOMAIN = "effectd"
_probes = itertools.count()


@dataclass(frozen=True, slots=True)
class Refusal:
    """A gRPC error as effectd describes it in the status details."""

    code: grpc.StatusCode
    message: str
    # None when the status carries no ErrorInfo.
    domain: str | None
    reason: str | None
    metadata: dict[str, str]
    # None when the status carries no BadRequest.
    fields: tuple[str, ...] | None


def decode(error: grpc.RpcError) -> Refusal:
    """The code, ErrorInfo and BadRequest of a failed call."""
    call = cast(grpc.Call, error)
    status = rpc_status.from_call(call)
    found = decode_status(status) if status is not None else None
    return Refusal(
        call.code(),
        call.details() or "",
        found.domain if found else None,
        found.reason if found else None,
        found.metadata if found else {},
        found.fields if found else None,
    )


def decode_status(status: status_pb2.Status) -> Refusal:
    """The code, ErrorInfo and BadRequest of a google.rpc.Status (a session
    message's `error`)."""
    domain: str | None = None
    reason: str | None = None
    metadata: dict[str, str] = {}
    fields: tuple[str, ...] | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            domain, reason, metadata = info.domain, info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields = tuple(v.field for v in bad.field_violations)
    code = next(c for c in grpc.StatusCode if c.value[0] == status.code)
    return Refusal(code, status.message, domain, reason, metadata, fields)


def refused(fn: Callable[[], object]) -> Refusal:
    """Runs `fn`, which must fail with a gRPC error, and decodes the error."""
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return decode(info.value)


def expect_refusal(
    fn: Callable[[], object], code: grpc.StatusCode, reason: str
) -> Refusal:
    """Runs `fn` and checks it is refused with `code` and effectd's `reason`."""
    got = refused(fn)
    assert (got.code, got.domain, got.reason) == (code, DOMAIN, reason), got
    return got


def ref(run_id: str = "run", call_id: str = "call", namespace: str = "") -> pb.CallRef:
    return pb.CallRef(namespace=namespace, run_id=run_id, call_id=call_id)


def prepare_request(
    run_id: str = "run",
    call_id: str = "call",
    *,
    json: str = "{}",
    namespace: str = "",
    tool_name: str = "tool",
    effect: pb.Effect.ValueType = pb.EFFECT_SIDE_EFFECT,
    start: bool = False,
    lease_ms: int = 0,
    require_approval: bool = False,
) -> pb.PrepareToolRequest:
    return pb.PrepareToolRequest(
        ref=ref(run_id, call_id, namespace),
        tool_name=tool_name,
        effect=effect,
        input=pb.Payload(json=json),
        start=start,
        lease_ms=lease_ms,
        require_approval=require_approval,
    )


def assert_serving(channel: grpc.Channel) -> None:
    """The daemon answers health SERVING and records a valid new call."""
    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=5
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    stub = ledger_pb2_grpc.ToolLedgerStub(channel)
    request = prepare_request("probe", f"probe-{next(_probes)}", json='{"ok":true}')
    answer = stub.PrepareTool(request, timeout=5)
    assert answer.decision == pb.DECISION_EXECUTE
    assert answer.call.state == pb.CALL_STATE_PREPARED
    assert answer.call.revision == 1
