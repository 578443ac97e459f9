"""Refusals from the daemon as one exception with the stable reason."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


class EffectdError(Exception):
    """A gRPC error from effectd: `reason` is the stable `ErrorReason` name."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: dict[str, str],
        violations: tuple[FieldViolation, ...],
    ) -> None:
        super().__init__(f"{reason or code.name}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = metadata
        self.violations = violations

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> EffectdError:
        call: grpc.Call = error  # type: ignore[assignment]
        reason, metadata, violations = "", {}, []
        status = rpc_status.from_call(call)
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations = [
                    FieldViolation(v.field, v.description) for v in bad.field_violations
                ]
        return cls(
            call.code(), reason, call.details() or "", metadata, tuple(violations)
        )
