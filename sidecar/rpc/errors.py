"""Domain errors to gRPC statuses, in one table.

Every refusal is a status whose details carry `google.rpc.ErrorInfo` (domain
`effectd`, the class's stable reason, metadata), and for bad input a
`google.rpc.BadRequest` with every field violation.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from sidecar.errors import (
    EffectdError,
    InvalidArgument,
    NotFound,
    NotImplementedYet,
    PermissionDenied,
    PreconditionFailed,
    RetryBudgetExhausted,
    RetryLater,
    RevisionConflict,
    ShuttingDown,
    StorageFull,
    StorageUnavailable,
    Throttled,
    Unauthenticated,
    UpstreamDeadlineExceeded,
    UpstreamFailed,
    UpstreamUnavailable,
)

DOMAIN = "effectd"

# Most specific class first; a subclass not listed takes its base's code.
CODES: dict[type[EffectdError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    RevisionConflict: grpc.StatusCode.ABORTED,
    PreconditionFailed: grpc.StatusCode.FAILED_PRECONDITION,
    StorageFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StorageUnavailable: grpc.StatusCode.UNAVAILABLE,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    NotImplementedYet: grpc.StatusCode.UNIMPLEMENTED,
    UpstreamUnavailable: grpc.StatusCode.UNAVAILABLE,
    UpstreamDeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    RetryBudgetExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    Throttled: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

# The status details travel in a trailer, which clients refuse past 8-16 KiB
# (gRPC's metadata limits): a BadRequest names at most this many fields, the
# first ones found (ErrorInfo metadata `omittedViolations` counts the rest).
MAX_VIOLATIONS = 32
MAX_DESCRIPTION = 200

# The trailer that carries a status's google.rpc.Status.
DETAILS_KEY = "grpc-status-details-bin"

# gRFC A6 pushback: the sidecar has retried already; clients must not stack theirs.
NO_PUSHBACK = ("grpc-retry-pushback-ms", "-1")


def code_of(error: EffectdError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in CODES:
            return CODES[cls]
    raise LookupError(f"{type(error).__name__} has no gRPC code")


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def to_status(error: EffectdError) -> grpc.Status:
    """The rich gRPC status for a domain error."""
    code = code_of(error)
    metadata = dict(error.metadata)
    if isinstance(error, InvalidArgument) and len(error.violations) > MAX_VIOLATIONS:
        metadata["omittedViolations"] = str(len(error.violations) - MAX_VIOLATIONS)
    details = [
        _pack(
            error_details_pb2.ErrorInfo(
                reason=error.reason, domain=DOMAIN, metadata=metadata
            )
        )
    ]
    if isinstance(error, InvalidArgument):
        violations = [
            error_details_pb2.BadRequest.FieldViolation(
                field=v.field, description=v.description[:MAX_DESCRIPTION]
            )
            for v in error.violations[:MAX_VIOLATIONS]
        ]
        details.append(_pack(error_details_pb2.BadRequest(field_violations=violations)))
    retry_delay = error.retry_delay if isinstance(error, RetryLater) else None
    if retry_delay is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry_delay * 1e9))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(
        code=code.value[0], message=error.message, details=details
    )
    rich = rpc_status.to_status(status)
    if isinstance(error, UpstreamFailed):
        return Status(rich.code, rich.details, (*rich.trailing_metadata, NO_PUSHBACK))
    return rich


@dataclass(frozen=True, slots=True)
class Status(grpc.Status):
    """A status as gRPC's servicer context takes it apart: code, details,
    trailing metadata."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def plain_status(code: grpc.StatusCode, message: str) -> grpc.Status:
    """A status without details (gRPC's own: a deadline, a cancellation)."""
    return Status(code, message, ())


def details_of(status: grpc.Status) -> status_pb2.Status:
    """The `google.rpc.Status` a unary call refused with `status` carries:
    its grpc-status-details-bin trailer, or its code and message alone when
    it has none (what a client's `rpc_status.from_call` then reads)."""
    for key, value in status.trailing_metadata or ():
        if key == DETAILS_KEY and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return status_pb2.Status(code=status.code.value[0], message=status.details or "")


def internal_status(message: str) -> grpc.Status:
    status = status_pb2.Status(code=code_pb2.INTERNAL, message=message)
    return rpc_status.to_status(status)
