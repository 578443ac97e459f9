"""The public surface of effectd_client is pinned."""

from __future__ import annotations

import effectd_client

EXPORTS = {
    # the clients and their values
    "AsyncClient",
    "Checkpoint",
    "Client",
    "Connection",
    "Decision",
    "Effect",
    "FieldViolation",
    "PlanItem",
    "Prepared",
    "RecoveryAction",
    "RecoveryPlan",
    "State",
    "ToolCall",
    "ToolResult",
    # the operator's surface: client.admin and client.operator
    "Admin",
    "AsyncAdmin",
    "AsyncOperator",
    "Caller",
    "Operator",
    # the safe tool call
    "AsyncRun",
    "AsyncSafeTool",
    "CallOptions",
    "Run",
    "SafeCall",
    "SafeTool",
    "OutcomeUnknown",
    "ToolCallStopped",
    "ApprovalPending",
    "CallInProgress",
    "CallRejected",
    "Channel",
    "ReconciliationNeeded",
    "RetryRequired",
    "ToolFailed",
    "ToolTimedOut",
    "ResultNotRecorded",
    "RecordingRetry",
    "current_call",
    # model calls through the sidecar
    "EffectdTransport",
    "AsyncEffectdTransport",
    "Httpx2EffectdTransport",
    "AsyncHttpx2EffectdTransport",
    "is_hop_by_hop",
    # refusals: EffectdError and one class per ErrorReason
    "EffectdError",
    "AlreadyCommitted",
    "AttemptsExhausted",
    "DeadlineExceeded",
    "InputMismatch",
    "InvalidRequest",
    "InvalidTransition",
    "McpNoReplay",
    "MissingIdempotencyKey",
    "NoPolicyFile",
    "NotFound",
    "NotImplementedYet",
    "PermissionDenied",
    "PolicyInvalid",
    "ReconciliationRequired",
    "ResultCompacted",
    "ResultMismatch",
    "RetryBudgetExhausted",
    "RetryDisabled",
    "RevisionConflict",
    "RouteNotAllowed",
    "RunNotReadOnly",
    "ShuttingDown",
    "SideEffectNotRetrySafe",
    "StaleAttempt",
    "StorageFull",
    "StorageUnavailable",
    "UpstreamDeadlineExceeded",
    "UpstreamUnavailable",
    "Unauthenticated",
    "UnsupportedKeyScheme",
    "QuotaExceeded",
    "RateLimited",
    "ReconcileQuarantine",
    "ConcurrencyLimited",
}


def test_the_export_list_is_pinned() -> None:
    """`__all__` is exactly the documented public names, each importable."""
    assert set(effectd_client.__all__) == EXPORTS
    assert len(effectd_client.__all__) == len(EXPORTS)
    for name in EXPORTS:
        assert getattr(effectd_client, name).__module__.startswith("effectd_client")
