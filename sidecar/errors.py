"""The domain exceptions of effectd, each owning one stable reason.

    EffectdError
    ├── InvalidArgument          INVALID_REQUEST          (bad input, field violations)
    ├── NotFound                 NOT_FOUND
    ├── RevisionConflict         REVISION_CONFLICT        (carries the current revision)
    ├── PreconditionFailed
    │   ├── InputMismatch        INPUT_MISMATCH
    │   ├── InvalidTransition    INVALID_TRANSITION
    │   ├── ReconciliationRequired RECONCILIATION_REQUIRED
    │   ├── SideEffectNotRetrySafe SIDE_EFFECT_NOT_RETRY_SAFE
    │   ├── StaleAttempt         STALE_ATTEMPT
    │   ├── ResultMismatch       RESULT_MISMATCH
    │   ├── AttemptsExhausted    ATTEMPTS_EXHAUSTED
    │   ├── ReconcileQuarantine  RECONCILE_QUARANTINE
    │   ├── MissingIdempotencyKey MISSING_IDEMPOTENCY_KEY
    │   ├── DeadlineExceeded     DEADLINE_EXCEEDED
    │   ├── AlreadyCommitted     ALREADY_COMMITTED
    │   ├── McpNoReplay          MCP_NO_REPLAY
    │   ├── RunNotReadOnly       RUN_NOT_READ_ONLY
    │   ├── RetryDisabled        RETRY_DISABLED
    │   ├── ResultCompacted      RESULT_COMPACTED
    │   ├── UnsupportedKeyScheme UNSUPPORTED_KEY_SCHEME
    │   ├── PolicyInvalid        POLICY_INVALID
    │   ├── NoPolicyFile         NO_POLICY_FILE
    │   └── RouteNotAllowed      ROUTE_NOT_ALLOWED
    ├── RetryLater               (carries the delay before a retry, when known)
    │   ├── UpstreamFailed       (a provider call without an HTTP answer)
    │   │   ├── UpstreamUnavailable UPSTREAM_UNAVAILABLE
    │   │   ├── UpstreamDeadlineExceeded UPSTREAM_DEADLINE_EXCEEDED
    │   │   └── RetryBudgetExhausted RETRY_BUDGET_EXHAUSTED
    │   └── Throttled            (RESOURCE_EXHAUSTED)
    │       ├── QuotaExceeded    QUOTA_EXCEEDED
    │       ├── RateLimited      RATE_LIMITED
    │       └── ConcurrencyLimited CONCURRENCY_LIMITED
    ├── Unauthenticated          UNAUTHENTICATED          (no handler ran)
    ├── PermissionDenied         PERMISSION_DENIED
    ├── StorageFull              STORAGE_FULL
    ├── StorageUnavailable       STORAGE_UNAVAILABLE
    ├── ShuttingDown             SHUTTING_DOWN
    └── NotImplementedYet        NOT_IMPLEMENTED

Reasons are the value names of `effectd.v1.ErrorReason`; the gRPC boundary
(`sidecar.rpc.errors`) maps each class to a status code in one table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One invalid field: its path in the request (`calls[2].ref.run_id`) and why."""

    field: str
    description: str


class EffectdError(Exception):
    """Base of every refusal effectd answers with."""

    reason: ClassVar[str] = "ERROR_REASON_UNSPECIFIED"

    def __init__(self, message: str, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})


class InvalidArgument(EffectdError):
    """The request is malformed; `violations` names every bad field."""

    reason = "INVALID_REQUEST"

    def __init__(self, violations: list[FieldViolation]) -> None:
        fields = ", ".join(v.field for v in violations[:5])
        more = f" and {len(violations) - 5} more" if len(violations) > 5 else ""
        super().__init__(f"invalid request: {fields}{more}")
        self.violations = list(violations)


class NotFound(EffectdError):
    """No record with this identity in the caller's namespace."""

    reason = "NOT_FOUND"


class RevisionConflict(EffectdError):
    """The expected revision (or absence) did not match."""

    reason = "REVISION_CONFLICT"

    def __init__(
        self,
        message: str,
        current_revision: int,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            message, {**(metadata or {}), "currentRevision": str(current_revision)}
        )
        self.current_revision = current_revision


class PreconditionFailed(EffectdError):
    """The record's state does not allow the request."""


class InputMismatch(PreconditionFailed):
    reason = "INPUT_MISMATCH"


class InvalidTransition(PreconditionFailed):
    reason = "INVALID_TRANSITION"


class ReconciliationRequired(PreconditionFailed):
    reason = "RECONCILIATION_REQUIRED"


class SideEffectNotRetrySafe(PreconditionFailed):
    reason = "SIDE_EFFECT_NOT_RETRY_SAFE"


class StaleAttempt(PreconditionFailed):
    reason = "STALE_ATTEMPT"


class ResultMismatch(PreconditionFailed):
    reason = "RESULT_MISMATCH"


class AttemptsExhausted(PreconditionFailed):
    reason = "ATTEMPTS_EXHAUSTED"


class ReconcileQuarantine(PreconditionFailed):
    """ "Never executed" for a call whose outcome has not been unknown for the
    quarantine yet, without the operator's confirmation that its attempt is
    dead: the holder may still be running (ADR-010 D1, R3)."""

    reason = "RECONCILE_QUARANTINE"


# Retry denials (contract §7.2): DecideRetry answers them as data; StartTool with
# `retry` refuses with them.


class MissingIdempotencyKey(PreconditionFailed):
    reason = "MISSING_IDEMPOTENCY_KEY"


class DeadlineExceeded(PreconditionFailed):
    reason = "DEADLINE_EXCEEDED"


class AlreadyCommitted(PreconditionFailed):
    reason = "ALREADY_COMMITTED"


class McpNoReplay(PreconditionFailed):
    reason = "MCP_NO_REPLAY"


class RunNotReadOnly(PreconditionFailed):
    reason = "RUN_NOT_READ_ONLY"


class RetryDisabled(PreconditionFailed):
    reason = "RETRY_DISABLED"


class ResultCompacted(PreconditionFailed):
    """The call's record became a tombstone after the retention window; it
    still refuses a re-execution (contract §4.7)."""

    reason = "RESULT_COMPACTED"


class UnsupportedKeyScheme(PreconditionFailed):
    """The stored call has an idempotency key scheme this daemon does not
    know (ADR-010 R4); it is neither changed nor given another key."""

    reason = "UNSUPPORTED_KEY_SCHEME"


class PolicyInvalid(PreconditionFailed):
    """A policy reload found the file invalid; the old policy stays (R2)."""

    reason = "POLICY_INVALID"


class NoPolicyFile(PreconditionFailed):
    """A policy reload without a policy file to read."""

    reason = "NO_POLICY_FILE"


class RouteNotAllowed(PreconditionFailed):
    """A provider request names no configured route, or a path outside it."""

    reason = "ROUTE_NOT_ALLOWED"


class RetryLater(EffectdError):
    """A refusal that may succeed later; `retry_delay` (seconds) is how long
    the client should wait, when it is known (the boundary sends it as a
    `google.rpc.RetryInfo`)."""

    def __init__(
        self,
        message: str,
        metadata: Mapping[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message, metadata)
        self.retry_delay = retry_delay


class UpstreamFailed(RetryLater):
    """A provider call ended without an HTTP answer."""


class UpstreamUnavailable(UpstreamFailed):
    reason = "UPSTREAM_UNAVAILABLE"


class UpstreamDeadlineExceeded(UpstreamFailed):
    reason = "UPSTREAM_DEADLINE_EXCEEDED"


class RetryBudgetExhausted(UpstreamFailed):
    reason = "RETRY_BUDGET_EXHAUSTED"


class Unauthenticated(EffectdError):
    """Authentication is on and the call's bearer token is missing or unknown."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(EffectdError):
    """The caller's credential does not allow this call."""

    reason = "PERMISSION_DENIED"


class Throttled(RetryLater):
    """A limit of the caller's namespace refused the request before anything
    was done."""


class QuotaExceeded(Throttled):
    """The namespace holds as many open calls or stored bytes as allowed."""

    reason = "QUOTA_EXCEEDED"


class RateLimited(Throttled):
    """The namespace sent more requests per second than allowed."""

    reason = "RATE_LIMITED"


class ConcurrencyLimited(Throttled):
    """The caller, or the daemon, has as many calls in flight as allowed."""

    reason = "CONCURRENCY_LIMITED"


class StorageFull(EffectdError):
    """The LMDB map is full; nothing of the request was written."""

    reason = "STORAGE_FULL"


class StorageUnavailable(EffectdError):
    """The storage failed to commit; nothing of the request was acknowledged."""

    reason = "STORAGE_UNAVAILABLE"


class ShuttingDown(EffectdError):
    reason = "SHUTTING_DOWN"


class NotImplementedYet(EffectdError):
    reason = "NOT_IMPLEMENTED"


class BackupTargetError(ValueError):
    """A backup was asked into a path that is not a new or empty directory."""
