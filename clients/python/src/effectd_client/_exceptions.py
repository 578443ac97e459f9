"""The client's exception tree: one class per `ErrorReason`, and the safe call's.

    Exception
    ├── EffectdError                 a refusal from the daemon (any reason)
    │   ├── InvalidRequest           INVALID_REQUEST: `violations` lists the fields
    │   ├── InputMismatch            INPUT_MISMATCH
    │   ├── RevisionConflict         REVISION_CONFLICT: `current_revision`
    │   └── ...                      one class per value of `ErrorReason`
    ├── OutcomeUnknown               raised BY a tool: it cannot know if it ran
    │   ├── ToolTimedOut             the safe call's deadline passed (also a
    │   │                            TimeoutError)
    │   └── ResultNotRecorded        the tool ran; the ledger could not record
    │                                its outcome
    └── ToolCallStopped              the safe call did not run the tool
        ├── ReconciliationNeeded     RECONCILE: an operator must reconcile
        ├── ApprovalPending          AWAIT_APPROVAL
        ├── CallInProgress           IN_PROGRESS: another attempt holds it
        ├── RetryRequired            unknown outcome, retry not asked for
        ├── CallRejected             REJECTED: `result` is the error result
        └── ToolFailed               the stored result is an error result

`class_of(reason)` is the one translation from a wire reason to its class; a
test proves that every `ErrorReason` value has one.

Longer than the client's other modules on purpose: the tree is drawn and
defined in this one module (as httpx's `_exceptions`), and most of its
length is one short class per `ErrorReason`; split, the drawing above would
describe classes defined elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from effectd_client._types import ToolCall, ToolResult

# -- the refusal every reason's class extends -------------------------------

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

    `from_rpc_error` returns the subclass of the reason (`class_of`), so
    callers can catch either one reason or every refusal with this class.
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


# -- one class per ErrorReason ----------------------------------------------


class InvalidRequest(EffectdError):
    """The request is malformed; `violations` names every bad field."""

    REASON: ClassVar[str] = "INVALID_REQUEST"


class InputMismatch(EffectdError):
    """The call was prepared before with another input, tool or effect."""

    REASON: ClassVar[str] = "INPUT_MISMATCH"


class InvalidTransition(EffectdError):
    """The event is not allowed in the record's current state."""

    REASON: ClassVar[str] = "INVALID_TRANSITION"


class RevisionConflict(EffectdError):
    """`expected_revision` did not match; see `current_revision`."""

    REASON: ClassVar[str] = "REVISION_CONFLICT"


class ReconciliationRequired(EffectdError):
    """A side effect of unknown outcome: only an operator may resolve it."""

    REASON: ClassVar[str] = "RECONCILIATION_REQUIRED"


class SideEffectNotRetrySafe(EffectdError):
    """A retry of a SIDE_EFFECT call was asked for."""

    REASON: ClassVar[str] = "SIDE_EFFECT_NOT_RETRY_SAFE"


class StaleAttempt(EffectdError):
    """The attempt (fencing token) no longer holds the call."""

    REASON: ClassVar[str] = "STALE_ATTEMPT"


class ResultMismatch(EffectdError):
    """The call is committed with another result; the first one stands."""

    REASON: ClassVar[str] = "RESULT_MISMATCH"


class AttemptsExhausted(EffectdError):
    """The attempt budget of the call is used up."""

    REASON: ClassVar[str] = "ATTEMPTS_EXHAUSTED"


class NotFound(EffectdError):
    """No record with this identity in the caller's namespace."""

    REASON: ClassVar[str] = "NOT_FOUND"


class StorageFull(EffectdError):
    """The daemon's storage is full; nothing was written."""

    REASON: ClassVar[str] = "STORAGE_FULL"


class StorageUnavailable(EffectdError):
    """The storage failed to commit; safe to retry."""

    REASON: ClassVar[str] = "STORAGE_UNAVAILABLE"


class PermissionDenied(EffectdError):
    """The credential does not allow this call."""

    REASON: ClassVar[str] = "PERMISSION_DENIED"


class RouteNotAllowed(EffectdError):
    """The provider route or path is not configured."""

    REASON: ClassVar[str] = "ROUTE_NOT_ALLOWED"


class ShuttingDown(EffectdError):
    """The daemon is shutting down."""

    REASON: ClassVar[str] = "SHUTTING_DOWN"


class NotImplementedYet(EffectdError):
    """The RPC is in the contract but not served by this daemon."""

    REASON: ClassVar[str] = "NOT_IMPLEMENTED"


class MissingIdempotencyKey(EffectdError):
    """An IDEMPOTENT_WRITE is retry-safe only with an idempotency key."""

    REASON: ClassVar[str] = "MISSING_IDEMPOTENCY_KEY"


class DeadlineExceeded(EffectdError):
    """The wait before a retry would pass the caller's deadline."""

    REASON: ClassVar[str] = "DEADLINE_EXCEEDED"


class AlreadyCommitted(EffectdError):
    """The call is committed: use its stored result."""

    REASON: ClassVar[str] = "ALREADY_COMMITTED"


class McpNoReplay(EffectdError):
    """An MCP call whose transport failed is never replayed."""

    REASON: ClassVar[str] = "MCP_NO_REPLAY"


class RunNotReadOnly(EffectdError):
    """A whole run is retried only when declared read-only."""

    REASON: ClassVar[str] = "RUN_NOT_READ_ONLY"


class RetryDisabled(EffectdError):
    """The operator's kill switch turned retries off."""

    REASON: ClassVar[str] = "RETRY_DISABLED"


class ResultCompacted(EffectdError):
    """The committed call was reduced to a tombstone; never run it again."""

    REASON: ClassVar[str] = "RESULT_COMPACTED"


class UnsupportedKeyScheme(EffectdError):
    """The call was created with an idempotency key scheme this daemon does
    not know; it is left untouched."""

    REASON: ClassVar[str] = "UNSUPPORTED_KEY_SCHEME"


class PolicyInvalid(EffectdError):
    """The policy file is unreadable or invalid; the old policy stays."""

    REASON: ClassVar[str] = "POLICY_INVALID"


class NoPolicyFile(EffectdError):
    """A policy reload was asked for without a policy file."""

    REASON: ClassVar[str] = "NO_POLICY_FILE"


class UpstreamUnavailable(EffectdError):
    """A provider call got no HTTP answer; the sidecar retried already."""

    REASON: ClassVar[str] = "UPSTREAM_UNAVAILABLE"


class UpstreamDeadlineExceeded(EffectdError):
    """A provider call got no HTTP answer within the gRPC deadline."""

    REASON: ClassVar[str] = "UPSTREAM_DEADLINE_EXCEEDED"


class RetryBudgetExhausted(EffectdError):
    """The host-wide retry budget had no credit; see `retry_delay`."""

    REASON: ClassVar[str] = "RETRY_BUDGET_EXHAUSTED"


class Unauthenticated(EffectdError):
    """Authentication is on and the call's bearer token is missing or unknown."""

    REASON: ClassVar[str] = "UNAUTHENTICATED"


class QuotaExceeded(EffectdError):
    """The namespace is at its quota of open calls or stored bytes; see
    `metadata["quota"]` and `retry_delay`."""

    REASON: ClassVar[str] = "QUOTA_EXCEEDED"


class RateLimited(EffectdError):
    """The namespace is over its request rate; wait `retry_delay` seconds."""

    REASON: ClassVar[str] = "RATE_LIMITED"


class ReconcileQuarantine(EffectdError):
    """ "Never executed" came before the call's quarantine ended: wait
    `metadata["remainingMs"]`, or confirm that attempt `metadata["attempt"]`
    is dead (`confirmed_dead_attempt`)."""

    REASON: ClassVar[str] = "RECONCILE_QUARANTINE"


class ConcurrencyLimited(EffectdError):
    """The caller already has as many calls in flight as it may (or the
    daemon as many as it serves); try again when one has ended."""

    REASON: ClassVar[str] = "CONCURRENCY_LIMITED"


REASON_CLASSES: dict[str, type[EffectdError]] = {
    cls.REASON: cls
    for cls in (
        InvalidRequest,
        InputMismatch,
        InvalidTransition,
        RevisionConflict,
        ReconciliationRequired,
        SideEffectNotRetrySafe,
        StaleAttempt,
        ResultMismatch,
        AttemptsExhausted,
        NotFound,
        StorageFull,
        StorageUnavailable,
        PermissionDenied,
        RouteNotAllowed,
        ShuttingDown,
        NotImplementedYet,
        MissingIdempotencyKey,
        DeadlineExceeded,
        AlreadyCommitted,
        McpNoReplay,
        RunNotReadOnly,
        RetryDisabled,
        ResultCompacted,
        UnsupportedKeyScheme,
        PolicyInvalid,
        NoPolicyFile,
        UpstreamUnavailable,
        UpstreamDeadlineExceeded,
        RetryBudgetExhausted,
        Unauthenticated,
        QuotaExceeded,
        RateLimited,
        ReconcileQuarantine,
        ConcurrencyLimited,
    )
}


def class_of(reason: str) -> type[EffectdError]:
    """The class of a wire reason; `EffectdError` for one this client predates."""
    return REASON_CLASSES.get(reason, EffectdError)


# -- the safe tool call -----------------------------------------------------


class OutcomeUnknown(Exception):
    """Raised by a tool that cannot know whether its effect happened.

    The safe call reports the attempt UNKNOWN and re-raises. So it does for
    `TimeoutError`, `ConnectionError`, a cancelled task, the transport and
    timeout errors of common client libraries, and what a tool declares with
    `unknown_on=` (see `effectd_client._safe_outcomes`); any other exception
    is a definite failure.
    """


class ToolTimedOut(OutcomeUnknown, TimeoutError):
    """The safe call's `timeout` passed while the tool ran.

    The attempt is reported UNKNOWN (the tool may have acted), never failed.
    """


class ResultNotRecorded(OutcomeUnknown):
    """The tool ran, but the ledger did not record its outcome.

    `result` is what the tool returned (`error` the exception it raised, if
    any); `__cause__` is the refusal or failure of the ledger, after the
    recording retries. The ledger still holds the attempt STARTED or UNKNOWN:
    a repeat of the call is never run again by itself (a side effect waits
    for reconciliation).
    """

    def __init__(
        self,
        message: str,
        call: ToolCall,
        *,
        result: object = None,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(f"{call.run_id}:{call.call_id}: {message}")
        self.call = call
        self.result = result
        self.error = error


class ToolCallStopped(Exception):
    """The safe call did not run the tool; `call` is the record as found."""

    def __init__(self, message: str, call: ToolCall) -> None:
        super().__init__(f"{call.run_id}:{call.call_id}: {message}")
        self.call = call


class ReconciliationNeeded(ToolCallStopped):
    """A side effect of unknown outcome: interrupt the run, never execute it."""


class ApprovalPending(ToolCallStopped):
    """The call waits for an approver."""


class CallInProgress(ToolCallStopped):
    """Another attempt holds a live lease on the call."""


class RetryRequired(ToolCallStopped):
    """The last attempt's outcome is unknown; retry only with `retry_unknown`."""


class CallRejected(ToolCallStopped):
    """An approver rejected the call; `result` is the stored error result."""

    def __init__(self, message: str, call: ToolCall, result: ToolResult) -> None:
        super().__init__(message, call)
        self.result = result


class ToolFailed(ToolCallStopped):
    """The call's committed result is an error: `error_code`, `error_message`.

    Raised by a replay instead of running the tool again.
    """

    def __init__(self, call: ToolCall, result: ToolResult) -> None:
        super().__init__(f"{result.error_code}: {result.error_message}", call)
        self.result = result
        self.error_code = result.error_code
        self.error_message = result.error_message
