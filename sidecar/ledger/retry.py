"""The retry rules of contract §7.2 (ADR-010 D5, D6, D7, R2, R5) as one pure function.

`decide` takes the facts of a failed attempt (effect, state, idempotency key,
the context it ran in, how it failed, attempts used, the deadline), the
operator's policy, the backoff parameters, the moment and one jitter sample,
and returns allow or deny with a reason. It never reads the error's
`retryable` flag: that flag is a diagnostic, never an authorization (D7).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sidecar import errors
from sidecar.ledger.model import Effect, State
from sidecar.ledger.policy import Policy


class RetryContext(enum.Enum):
    """Where the failed attempt ran."""

    TOOL = "tool"
    MCP = "mcp"
    CHILD_FOREGROUND = "child_foreground"
    DURABLE_BACKGROUND = "durable_background"
    RUN = "run"


class FailureKind(enum.Enum):
    """How the attempt failed, as far as the caller can tell."""

    # The connection failed: the request may or may not have been executed.
    TRANSPORT = "transport"
    # No answer within the attempt's time: the outcome is unknown.
    TIMEOUT = "timeout"
    # The target answered with an error: it did receive the request.
    APPLICATION = "application"
    # The caller does not know; treated like a transport failure.
    UNKNOWN = "unknown"


class Reason(enum.Enum):
    """Why a retry is denied; each name is a value of `effectd.v1.ErrorReason`."""

    ALREADY_COMMITTED = "already_committed"
    INVALID_TRANSITION = "invalid_transition"
    RUN_NOT_READ_ONLY = "run_not_read_only"
    MCP_NO_REPLAY = "mcp_no_replay"
    RECONCILIATION_REQUIRED = "reconciliation_required"
    SIDE_EFFECT_NOT_RETRY_SAFE = "side_effect_not_retry_safe"
    MISSING_IDEMPOTENCY_KEY = "missing_idempotency_key"
    RETRY_DISABLED = "retry_disabled"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter that survives the cap.

    Retry n waits `b * (1 - jitter / 2)` with `b = min(cap, initial *
    multiplier ** (n - 1))`, so the wait lies in (b/2, b]: never a near-zero
    hammering, and callers at the cap still spread out.
    """

    initial_ms: int = 500
    multiplier: float = 2.0
    cap_ms: int = 8_000

    def delay_ms(self, retry_number: int, jitter: float) -> int:
        """The wait before retry `retry_number` (1 for the first retry);
        `jitter` is a sample of U[0, 1)."""
        exponent = max(retry_number, 1) - 1
        base = min(float(self.cap_ms), self.initial_ms * self.multiplier**exponent)
        return int(base * (1.0 - 0.5 * jitter))


@dataclass(frozen=True, slots=True)
class Facts:
    """What is known of the call whose attempt failed."""

    # The effect as declared; the policy may force another (R2).
    effect: Effect
    state: State
    idempotency_key: str
    tool_name: str = ""
    # A recorded STARTED call whose attempt still holds a live lease: nothing
    # failed yet, and StartTool answers IN_PROGRESS.
    lease_live: bool = False


@dataclass(frozen=True, slots=True)
class RetryQuestion:
    facts: Facts
    context: RetryContext
    failure: FailureKind
    # The error's own classification. Never read by `decide` (ADR-010 D7).
    retryable: bool
    attempts_used: int
    # Wall-clock nanoseconds; None means no deadline.
    deadline_ns: int | None = None
    # A budget lower than the policy's; 0 means the policy's.
    max_attempts: int = 0


@dataclass(frozen=True, slots=True)
class RetryDecision:
    allow: bool
    # None exactly when allowed.
    reason: Reason | None
    message: str
    # The effect the rules assumed (the policy's override wins).
    effect: Effect
    max_attempts: int
    # The wait before the retry; when denied, 0 unless the reason is the
    # deadline the wait would pass.
    backoff_ms: int = 0


UNRESOLVED = frozenset({State.STARTED, State.UNKNOWN})

# The refusal that stands for each denial where a request, not a question,
# asked for the retry (StartTool with `retry`).
ERRORS: dict[Reason, type[errors.EffectdError]] = {
    Reason.ALREADY_COMMITTED: errors.AlreadyCommitted,
    Reason.INVALID_TRANSITION: errors.InvalidTransition,
    Reason.RUN_NOT_READ_ONLY: errors.RunNotReadOnly,
    Reason.MCP_NO_REPLAY: errors.McpNoReplay,
    Reason.RECONCILIATION_REQUIRED: errors.ReconciliationRequired,
    Reason.SIDE_EFFECT_NOT_RETRY_SAFE: errors.SideEffectNotRetrySafe,
    Reason.MISSING_IDEMPOTENCY_KEY: errors.MissingIdempotencyKey,
    Reason.RETRY_DISABLED: errors.RetryDisabled,
    Reason.ATTEMPTS_EXHAUSTED: errors.AttemptsExhausted,
    Reason.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
}


def decide(
    question: RetryQuestion,
    policy: Policy,
    backoff: Backoff,
    *,
    now_wall_ns: int,
    jitter: float,
) -> RetryDecision:
    """Whether the failed attempt may be retried, and after what wait.

    The first rule that denies wins, in this order: the call's state, the
    context, the effect, the operator's kill switch, the attempt budget, and
    last the deadline (only an otherwise allowed retry has a wait to check).
    """
    facts = question.facts
    effect = policy.effect_of(facts.tool_name, facts.effect)
    budget = policy.max_attempts
    if question.max_attempts:
        budget = min(budget, question.max_attempts)

    def deny(reason: Reason, message: str, wait: int = 0) -> RetryDecision:
        return RetryDecision(False, reason, message, effect, budget, wait)

    denial = _state_rule(facts) or _context_rule(question, effect)
    denial = denial or _effect_rule(question, effect)
    if denial is not None:
        return deny(*denial)
    if not policy.retry_safe_enabled:
        # ADR-010 R2: the operator's kill switch turns every retry off at once.
        return deny(Reason.RETRY_DISABLED, "the operator disabled retry-safe policies")
    if question.attempts_used >= budget:
        # contract §7.2: the attempt budget always applies.
        return deny(
            Reason.ATTEMPTS_EXHAUSTED,
            f"{question.attempts_used} of {budget} attempts used",
        )
    wait = backoff.delay_ms(question.attempts_used, jitter)
    deadline = question.deadline_ns
    if deadline is not None and now_wall_ns + wait * 1_000_000 >= deadline:
        # contract §7.2: the deadline always applies, the wait included.
        return deny(
            Reason.DEADLINE_EXCEEDED,
            f"the retry after {wait} ms would pass the deadline",
            wait,
        )
    return RetryDecision(True, None, "retry allowed", effect, budget, wait)


def _state_rule(facts: Facts) -> tuple[Reason, str] | None:
    state = facts.state
    if state is State.STARTED and facts.lease_live:
        # contract §5.1 IN_PROGRESS: another attempt holds a live lease; a retry
        # now would run the call beside it (StartTool answers IN_PROGRESS).
        return (
            Reason.INVALID_TRANSITION,
            "an attempt holds a live lease: wait for its outcome or for its "
            "lease to run out",
        )
    if state is State.COMMITTED:
        # contract §7.2: COMMITTED is never retried; ADR-010 D1, D3 use the result.
        return Reason.ALREADY_COMMITTED, "the call is committed: use its stored result"
    if state is State.AWAITING_APPROVAL:
        # ADR-010 D3: only an approval lets the call run; nothing ran to retry.
        return Reason.INVALID_TRANSITION, "the call waits for an approver"
    return None


def _context_rule(question: RetryQuestion, effect: Effect) -> tuple[Reason, str] | None:
    if question.context is RetryContext.RUN and effect is not Effect.READ:
        # ADR-010 R5 and "rejected alternatives": a whole run may have executed
        # side effects; only a run declared read-only is retried.
        return Reason.RUN_NOT_READ_ONLY, "a whole run is retried only if read-only"
    if (
        question.context is RetryContext.MCP
        and question.failure is not FailureKind.APPLICATION
    ):
        # ADR-010 D5: after a transport failure the server may have completed
        # the call; only a new logical call may reconnect.
        return (
            Reason.MCP_NO_REPLAY,
            "an MCP call is never replayed after a transport failure; "
            "make a new logical call",
        )
    return None


def _effect_rule(question: RetryQuestion, effect: Effect) -> tuple[Reason, str] | None:
    facts = question.facts
    if effect is Effect.SIDE_EFFECT:
        if (
            question.context is RetryContext.DURABLE_BACKGROUND
            and facts.state in UNRESOLVED
        ):
            # ADR-010 D6: a stale durable execution that may have committed a
            # side effect goes to reconciliation, not replay.
            return (
                Reason.RECONCILIATION_REQUIRED,
                "a stale durable side effect is reconciled, never replayed",
            )
        # ADR-010 D6, D3: a side effect is never retry-safe.
        return Reason.SIDE_EFFECT_NOT_RETRY_SAFE, "a side effect is never retry-safe"
    if effect is Effect.IDEMPOTENT_WRITE and not facts.idempotency_key:
        # ADR-010 D6: idempotent-write is retry-safe only with a non-empty key.
        return (
            Reason.MISSING_IDEMPOTENCY_KEY,
            "an idempotent write is retry-safe only with an idempotency key",
        )
    return None


def refusal(decision: RetryDecision, attempts_used: int) -> errors.EffectdError:
    """The refusal for a denied retry (its class owns the denial's reason)."""
    assert decision.reason is not None
    metadata = {}
    if decision.reason is Reason.ATTEMPTS_EXHAUSTED:
        metadata = {
            "attempts": str(attempts_used),
            "maxAttempts": str(decision.max_attempts),
        }
    return ERRORS[decision.reason](decision.message, metadata)
