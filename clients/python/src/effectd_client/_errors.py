"""Refusals from the daemon as one exception with the stable reason."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

_DETAILS_KEY = "grpc-status-details-bin"
# The codes that mean exactly one ErrorReason, whoever sent them.
_REASON_OF_CODE = {
    grpc.StatusCode.UNAUTHENTICATED: "UNAUTHENTICATED",
    grpc.StatusCode.PERMISSION_DENIED: "PERMISSION_DENIED",
}


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


class EffectdError(Exception):
    """A gRPC error from effectd: `reason` is the stable `ErrorReason` name.

    `from_rpc_error` returns the subclass of the reason (see
    `effectd_client._exceptions`), so callers can catch either one reason or
    every refusal with this class.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: dict[str, str],
        violations: tuple[FieldViolation, ...],
        *,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(f"{reason or code.name}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = metadata
        self.violations = violations
        # Seconds, from google.rpc.RetryInfo when the daemon sent one.
        self.retry_delay = retry_delay

    @property
    def current_revision(self) -> int | None:
        """The record's revision from a REVISION_CONFLICT, when carried."""
        value = self.metadata.get("currentRevision")
        return None if value is None or not value.isdigit() else int(value)

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> EffectdError:
        """The exception of the error's reason, for sync and aio errors alike."""
        # Imported here: the subclasses import this module.
        from effectd_client._exceptions import class_of  # noqa: PLC0415

        call: grpc.Call = error  # type: ignore[assignment]
        reason, metadata = "", {}
        violations: list[FieldViolation] = []
        retry_delay: float | None = None
        for detail in _status_details(call):
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
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_delay = retry.retry_delay.ToNanoseconds() / 1e9
        code = call.code()
        if not reason:
            # A refusal made before the daemon's error table (a proxy, a
            # transport-level check) still names its one possible reason.
            reason = _REASON_OF_CODE.get(code, "")
        return class_of(reason)(
            code,
            reason,
            call.details() or "",
            metadata,
            tuple(violations),
            retry_delay=retry_delay,
        )


def _status_details(call: grpc.Call) -> list[any_pb2.Any]:
    """The `google.rpc.Status` details of a failed call, sync or aio.

    Read from the trailer directly: `grpc_status.rpc_status.from_call` only
    understands the sync call's metadata tuples.
    """
    for key, value in call.trailing_metadata() or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            return list(status_pb2.Status.FromString(value).details)
    return []
