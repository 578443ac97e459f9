"""The rules of the requests on an attempt (contract §4, §5.2): StartTool (and
the explicit retry of an attempt of unknown outcome, under the retry rules of
`sidecar.ledger.retry`), CommitTool, ReportUnknown and Heartbeat. Only the
attempt that holds the call may commit it, report it unknown or extend its
lease.
"""

from __future__ import annotations

from sidecar.errors import (
    EffectdError,
    InvalidTransition,
    ReconciliationRequired,
    ResultMismatch,
    RevisionConflict,
)
from sidecar.ledger import kept_inputs, machine
from sidecar.ledger import retry as retry_rules
from sidecar.ledger.model import Decision, Effect, Event, Result, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.steps import (
    AGENT,
    Answer,
    Now,
    Step,
    answer_for,
    begin,
    check_attempt,
    check_revision,
    decide,
    enforce,
    invalid,
    moved_on,
    new_lease,
    settle,
)


def start(
    call: ToolCall,
    now: Now,
    *,
    lease_ms: int,
    retry: bool,
    expected_revision: int | None,
    policy: Policy,
    actor: str = AGENT,
) -> Step:
    """StartTool: only the caller that finds the call PREPARED gets EXECUTE.

    A retry goes through the retry rules of `sidecar.ledger.retry` under
    `policy`.
    """
    try:
        check_revision(call, expected_revision)
    except RevisionConflict as exc:
        return Step(call, exc)
    settled = enforce(settle(call, now), policy, now)
    if settled.state is State.PREPARED:
        started = begin(settled, now, lease_ms, Event.START, actor)
        return Step(started, Answer(Decision.EXECUTE, started, attempt_held=True))
    if settled.state is State.UNKNOWN:
        return retry_unknown(
            settled, now, lease_ms=lease_ms, retry=retry, policy=policy, actor=actor
        )
    return Step(settled, answer_for(settled, policy=policy))


def retry_unknown(
    call: ToolCall, now: Now, *, lease_ms: int, retry: bool, policy: Policy, actor: str
) -> Step:
    """Start an attempt of unknown outcome again, if an explicit `retry` is
    allowed under the retry rules and `policy`; otherwise refuse, saying why."""
    refusal: EffectdError | None = None
    # contract §4.2: StartTool answers a side effect's retry RECONCILIATION_REQUIRED
    # (the retry rules would say SIDE_EFFECT_NOT_RETRY_SAFE); a forced
    # SIDE_EFFECT override of the policy counts (ADR-010 R2).
    if policy.effect_for(call) is Effect.SIDE_EFFECT:
        refusal = ReconciliationRequired(
            "the outcome of this side effect is unknown: it is never replayed; "
            "reconcile it",
            {"attempt": str(call.attempt)},
        )
    elif not retry:
        refusal = InvalidTransition(
            f"the outcome of attempt {call.attempt} is unknown: it starts again "
            "only as an explicit retry (retry = true), under the retry rules",
            {
                "state": call.state.name,
                "event": Event.START.value,
                "attempt": str(call.attempt),
                "retryRequired": "true",
            },
        )
    else:
        question = retry_rules.RetryQuestion(
            facts=retry_rules.Facts(
                call.recorded_effect, call.state, call.idempotency_key, call.tool_name
            ),
            # ADR-010 D5, D6: the rules of the channel the call was prepared
            # through; the ledger knows only that the outcome is unknown.
            context=retry_rules.RetryContext(call.channel.value),
            failure=retry_rules.FailureKind.UNKNOWN,
            retryable=False,
            attempts_used=call.attempt,
        )
        # No deadline and no wait here: the caller asked for the retry now
        # (DecideRetry is where it learns its backoff).
        decision = retry_rules.decide(
            question,
            policy,
            retry_rules.Backoff(),
            now_wall_ns=now.wall_ns,
            jitter=0.0,
        )
        if not decision.allow:
            refusal = retry_rules.refusal(decision, call.attempt)
    if refusal is not None:
        return Step(call, refusal)
    started = begin(call, now, lease_ms, Event.RETRY, actor)
    return Step(started, Answer(Decision.EXECUTE, started, attempt_held=True))


def commit(
    call: ToolCall,
    now: Now,
    *,
    attempt: int,
    result: Result,
    expected_revision: int | None,
    actor: str = AGENT,
    acknowledge: bool = False,
    policy: Policy | None = None,
) -> Step:
    """CommitTool: store the result of the attempt that holds the call; with
    `acknowledge`, also mark it delivered (contract §6.2), in the same step.
    The kept input goes, unless `policy` keeps settled inputs (`kept_inputs`)."""
    if call.state is State.COMMITTED:
        assert call.result is not None
        if call.result.digest == result.digest:
            done = delivered(call, now, actor) if acknowledge else call
            return Step(done, Answer(decide(done), done))
        return Step(
            call,
            ResultMismatch(
                "the call is already committed with another result; "
                "the first result stands",
                {"committedDigest": call.result.digest},
            ),
        )
    try:
        check_revision(call, expected_revision)
    except RevisionConflict as exc:
        return Step(call, exc)
    if call.state not in (State.STARTED, State.UNKNOWN):
        return Step(call, moved_on(call, attempt) or invalid(call, Event.COMMIT))
    stale = check_attempt(call, attempt)
    if stale is not None:
        return Step(call, stale)
    committed = machine.apply(
        call,
        Event.COMMIT,
        at_ns=now.wall_ns,
        actor=actor,
        lease=None,
        result=result,
        kept_input=kept_inputs.settled(call, policy),
    )
    if acknowledge:
        committed = delivered(committed, now, actor)
    return Step(committed, Answer(decide(committed), committed))


def delivered(call: ToolCall, now: Now, actor: str = AGENT) -> ToolCall:
    """A COMMITTED call marked delivered (AcknowledgeRecovery); unchanged if
    it was already."""
    if call.acknowledged:
        return call
    # machine.apply refuses ACKNOWLEDGE in any state but COMMITTED.
    return machine.apply(
        call, Event.ACKNOWLEDGE, at_ns=now.wall_ns, actor=actor, acknowledged=True
    )


def report_unknown(
    call: ToolCall,
    now: Now,
    *,
    attempt: int,
    reason: str,
    policy: Policy | None = None,
    actor: str = AGENT,
) -> Step:
    """ReportUnknown: the attempt cannot tell whether the tool ran."""
    call = enforce(call, policy, now)
    if call.state is State.UNKNOWN and attempt == call.attempt:
        return Step(call, answer_for(call, policy=policy))
    if call.state is not State.STARTED:
        refusal = moved_on(call, attempt) or invalid(call, Event.REPORT_UNKNOWN)
        return Step(call, refusal)
    stale = check_attempt(call, attempt)
    if stale is not None:
        return Step(call, stale)
    unknown = machine.apply(
        call,
        Event.REPORT_UNKNOWN,
        at_ns=now.wall_ns,
        actor=actor,
        reason=reason,
        lease=None,
        unknown_since_ns=now.wall_ns,
    )
    return Step(unknown, answer_for(unknown, policy=policy))


def heartbeat(
    call: ToolCall, now: Now, *, attempt: int, lease_ms: int, actor: str = AGENT
) -> Step:
    """Heartbeat: extend the lease of the attempt that holds a live call."""
    settled = settle(call, now)
    if settled.state is not State.STARTED:
        refusal = moved_on(settled, attempt) or invalid(settled, Event.HEARTBEAT)
        return Step(settled, refusal)
    stale = check_attempt(settled, attempt)
    if stale is not None:
        return Step(settled, stale)
    extended = machine.apply(
        settled,
        Event.HEARTBEAT,
        at_ns=now.wall_ns,
        actor=actor,
        lease=new_lease(now, lease_ms),
        lease_ms=lease_ms,
    )
    return Step(extended, answer_for(extended))
