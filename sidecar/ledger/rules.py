"""What each ledger request does to a record, as pure functions (DESIGN §4, §5).

Every rule takes the stored record (or None) and the moment (`Now`) and
returns a `Step`: the record as it must be stored, and the reply, which is
either an `Answer` or a refusal. A refusal can still carry a changed record:
a STARTED call whose lease ran out becomes UNKNOWN durably even when the
request that noticed it is refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sidecar.errors import (
    EffectdError,
    InputMismatch,
    InvalidTransition,
    ReconciliationRequired,
    ResultMismatch,
    RevisionConflict,
    StaleAttempt,
)
from sidecar.ledger import kept_inputs, machine
from sidecar.ledger import retry as retry_rules
from sidecar.ledger.model import (
    CallRef,
    Channel,
    Decision,
    Effect,
    Event,
    Lease,
    Payload,
    Result,
    State,
    ToolCall,
    Transition,
)
from sidecar.ledger.policy import Policy

AGENT = "agent"
DAEMON = "effectd"


@dataclass(frozen=True, slots=True)
class Now:
    """The moment a rule runs: both clocks and the daemon's incarnation."""

    wall_ns: int
    monotonic_ns: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class PrepareSpec:
    ref: CallRef
    tool_name: str
    effect: Effect
    input: Payload
    fingerprint: str
    require_approval: bool
    start: bool
    lease_ms: int
    # Who prepares: recorded in the history (the token's name with
    # authentication on).
    actor: str = AGENT
    # With `start`: start a call whose last attempt has an unknown outcome
    # again, as an explicit retry under the retry rules (as StartTool's).
    retry: bool = False
    # How the agent reaches the tool (ADR-010 D5, D6); part of the identity.
    channel: Channel = Channel.TOOL


@dataclass(frozen=True, slots=True)
class Answer:
    decision: Decision
    call: ToolCall
    # This caller holds the attempt (`call.attempt` is its fencing token).
    attempt_held: bool = False
    # EXECUTE of a plain prepare (without start) after an attempt of unknown
    # outcome: only an explicit retry (start with retry) may start it.
    retry_required: bool = False

    @property
    def idempotency_key(self) -> str:
        """The key a tool must de-duplicate on; only IDEMPOTENT_WRITE gets one."""
        if self.call.effect is Effect.IDEMPOTENT_WRITE:
            return self.call.idempotency_key
        return ""


@dataclass(frozen=True, slots=True)
class Step:
    call: ToolCall
    reply: Answer | EffectdError


def _lease(now: Now, lease_ms: int) -> Lease:
    span = lease_ms * 1_000_000
    return Lease(now.incarnation, now.monotonic_ns + span, now.wall_ns + span)


def settle(call: ToolCall, now: Now) -> ToolCall:
    """A STARTED call whose lease is no longer live becomes UNKNOWN.

    A lease of an earlier daemon incarnation is never live: whoever held it
    may have executed the call (ADR-010 D3).
    """
    if call.state is not State.STARTED or call.lease is None:
        return call
    if call.lease.is_live(now.incarnation, now.monotonic_ns):
        return call
    if call.lease.incarnation != now.incarnation:
        event, reason = Event.RESTART, "started under an earlier daemon incarnation"
    else:
        event, reason = Event.EXPIRE, "lease expired"
    # The outcome is unknown from the lease's end, however late it is noticed.
    since = min(now.wall_ns, call.lease.expires_wall_ns)
    return machine.apply(
        call,
        event,
        at_ns=now.wall_ns,
        actor=DAEMON,
        reason=reason,
        lease=None,
        unknown_since_ns=since,
    )


def decide(call: ToolCall, policy: Policy | None = None) -> Decision:
    """The decision for a settled record (DESIGN §5), under `policy`."""
    # ADR-010 R2: a tool the operator forced to SIDE_EFFECT is one from the
    # next decision on, whatever its callers declared; a call it was forced on
    # stays one.
    effect = call.recorded_effect if policy is None else policy.effect_for(call)
    match call.state:
        case State.PREPARED:
            return Decision.EXECUTE
        case State.AWAITING_APPROVAL:
            return Decision.AWAIT_APPROVAL
        case State.STARTED:
            return Decision.IN_PROGRESS
        case State.UNKNOWN:
            if effect is Effect.SIDE_EFFECT:
                return Decision.RECONCILE
            return Decision.EXECUTE
        case State.COMMITTED:
            return Decision.REJECTED if call.rejected else Decision.RETURN_RESULT
    raise AssertionError(call.state)  # pragma: no cover


def enforce(call: ToolCall, policy: Policy | None, now: Now) -> ToolCall:
    """`call` with the effect `policy` forces on it recorded for good.

    ADR-010 R2: once a decision about an open call assumed a SIDE_EFFECT
    because the operator forced the tool to one, the call stays one, so
    taking the override out of the policy never reopens retries of calls
    that were answered RECONCILE. A committed call has nothing to decide.
    """
    if policy is None or call.state is State.COMMITTED:
        return call
    if call.recorded_effect is Effect.SIDE_EFFECT:
        return call
    if policy.effect_of(call.tool_name, call.effect) is not Effect.SIDE_EFFECT:
        return call
    return machine.apply(
        call,
        Event.FORCE_SIDE_EFFECT,
        at_ns=now.wall_ns,
        actor=DAEMON,
        reason="the policy forces this tool to side-effect (ADR-010 R2)",
        forced_effect=Effect.SIDE_EFFECT,
    )


def _answer(
    call: ToolCall, *, held: bool = False, policy: Policy | None = None
) -> Answer:
    decision = decide(call, policy)
    retry = call.state is State.UNKNOWN and decision is Decision.EXECUTE
    return Answer(decision, call, attempt_held=held, retry_required=retry)


def _start(
    call: ToolCall, now: Now, lease_ms: int, event: Event, actor: str
) -> ToolCall:
    return machine.apply(
        call,
        event,
        at_ns=now.wall_ns,
        actor=actor,
        attempt=call.attempt + 1,
        lease=_lease(now, lease_ms),
        lease_ms=lease_ms,
    )


def _check_revision(call: ToolCall | None, expected: int | None) -> None:
    current = 0 if call is None else call.revision
    if expected is not None and expected != current:
        raise RevisionConflict(
            f"expected revision {expected}, the record is at {current}", current
        )


def prepare(
    existing: ToolCall | None,
    spec: PrepareSpec,
    now: Now,
    policy: Policy | None = None,
) -> Step:
    """PrepareTool: record the call, or answer for the existing record.

    With `spec.start`, EXECUTE means that this caller holds the attempt
    (DESIGN §5), and a call whose last attempt has an unknown outcome is
    started again only as StartTool would start it: an explicit retry
    (`spec.retry`) under the retry rules, in this transaction; otherwise the
    refusal says why. A SIDE_EFFECT of unknown outcome answers RECONCILE.
    """
    if existing is None:
        call = _create(spec, now, policy)
        if policy is not None and policy.effect_for(call) is not call.effect:
            # Recorded with the call: decided under the override (R2).
            call = dataclasses.replace(call, forced_effect=Effect.SIDE_EFFECT)
    else:
        mismatch = _mismatch(existing, spec)
        if mismatch:
            meta = {"callRevision": str(existing.revision)}
            return Step(existing, InputMismatch(mismatch, meta))
        call = enforce(settle(existing, now), policy, now)
        if spec.require_approval and not call.approval_required:
            return _require_approval(existing, call, spec, now, policy)
    if spec.start and call.state is State.PREPARED:
        started = _start(call, now, spec.lease_ms, Event.START, spec.actor)
        return Step(started, Answer(Decision.EXECUTE, started, attempt_held=True))
    answer = _answer(call, policy=policy)
    if spec.start and answer.retry_required:
        return _retry(
            call,
            now,
            lease_ms=spec.lease_ms,
            retry=spec.retry,
            policy=policy or Policy(),
            actor=spec.actor,
        )
    return Step(call, answer)


def _require_approval(
    existing: ToolCall,
    call: ToolCall,
    spec: PrepareSpec,
    now: Now,
    policy: Policy | None,
) -> Step:
    """A repeat prepare that requires an approval the call was prepared
    without: a call that never started waits for it (AWAITING_APPROVAL); one
    that started already ran without it, so the prepare is refused."""
    if call.state is not State.PREPARED:
        return Step(
            existing,
            InputMismatch(
                "the call was prepared without approval and has started: an "
                "approval cannot be required after the fact; use a new call_id",
                {"callRevision": str(existing.revision), "state": call.state.name},
            ),
        )
    waiting = machine.apply(
        call,
        Event.REQUIRE_APPROVAL,
        at_ns=now.wall_ns,
        actor=spec.actor,
        reason="a repeat prepare requires approval",
        approval_required=True,
    )
    return Step(waiting, _answer(waiting, policy=policy))


def _create(spec: PrepareSpec, now: Now, policy: Policy | None) -> ToolCall:
    state = State.AWAITING_APPROVAL if spec.require_approval else State.PREPARED
    entry = Transition(None, state, Event.PREPARE, now.wall_ns, spec.actor, "", 1, 0)
    return ToolCall(
        ref=spec.ref,
        tool_name=spec.tool_name,
        effect=spec.effect,
        state=state,
        revision=1,
        input_fingerprint=spec.fingerprint,
        approval_required=spec.require_approval,
        channel=spec.channel,
        attempt=0,
        created_ns=now.wall_ns,
        updated_ns=now.wall_ns,
        history=(entry,),
        kept_input=kept_inputs.kept(
            spec.input, require_approval=spec.require_approval, policy=policy
        ),
    )


def _mismatch(call: ToolCall, spec: PrepareSpec) -> str:
    if call.input_fingerprint != spec.fingerprint:
        return (
            "the call was prepared with another input; use a new call_id for a new call"
        )
    if call.tool_name != spec.tool_name:
        return f"the call was prepared for tool {call.tool_name!r}"
    if call.effect is not spec.effect:
        return f"the call was prepared with effect {call.effect.name}"
    if call.channel is not spec.channel:
        return f"the call was prepared through channel {call.channel.name}"
    return ""


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
        _check_revision(call, expected_revision)
    except RevisionConflict as exc:
        return Step(call, exc)
    settled = enforce(settle(call, now), policy, now)
    if settled.state is State.PREPARED:
        started = _start(settled, now, lease_ms, Event.START, actor)
        return Step(started, Answer(Decision.EXECUTE, started, attempt_held=True))
    if settled.state is State.UNKNOWN:
        return _retry(
            settled, now, lease_ms=lease_ms, retry=retry, policy=policy, actor=actor
        )
    return Step(settled, _answer(settled, policy=policy))


def _retry(
    call: ToolCall, now: Now, *, lease_ms: int, retry: bool, policy: Policy, actor: str
) -> Step:
    refusal: EffectdError | None = None
    # DESIGN §4: StartTool answers a side effect's retry RECONCILIATION_REQUIRED
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
    started = _start(call, now, lease_ms, Event.RETRY, actor)
    return Step(started, Answer(Decision.EXECUTE, started, attempt_held=True))


def _check_attempt(call: ToolCall, attempt: int) -> EffectdError | None:
    if attempt != call.attempt or call.attempt == 0:
        return StaleAttempt(
            f"attempt {attempt} does not hold the call "
            f"(current attempt {call.attempt})",
            {"currentAttempt": str(call.attempt)},
        )
    return None


def commit(
    call: ToolCall,
    now: Now,
    *,
    attempt: int,
    result: Result,
    expected_revision: int | None,
    actor: str = AGENT,
) -> Step:
    """CommitTool: store the result of the attempt that holds the call."""
    if call.state is State.COMMITTED:
        assert call.result is not None
        if call.result.digest == result.digest:
            return Step(call, Answer(decide(call), call))
        return Step(
            call,
            ResultMismatch(
                "the call is already committed with another result; "
                "the first result stands",
                {"committedDigest": call.result.digest},
            ),
        )
    try:
        _check_revision(call, expected_revision)
    except RevisionConflict as exc:
        return Step(call, exc)
    if call.state not in (State.STARTED, State.UNKNOWN):
        return Step(call, _invalid(call, Event.COMMIT))
    stale = _check_attempt(call, attempt)
    if stale is not None:
        return Step(call, stale)
    committed = machine.apply(
        call, Event.COMMIT, at_ns=now.wall_ns, actor=actor, lease=None, result=result
    )
    return Step(committed, Answer(decide(committed), committed))


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
        return Step(call, _answer(call, policy=policy))
    if call.state is not State.STARTED:
        return Step(call, _invalid(call, Event.REPORT_UNKNOWN))
    stale = _check_attempt(call, attempt)
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
    return Step(unknown, _answer(unknown, policy=policy))


def heartbeat(
    call: ToolCall, now: Now, *, attempt: int, lease_ms: int, actor: str = AGENT
) -> Step:
    """Heartbeat: extend the lease of the attempt that holds a live call."""
    settled = settle(call, now)
    if settled.state is not State.STARTED:
        return Step(settled, _invalid(settled, Event.HEARTBEAT))
    stale = _check_attempt(settled, attempt)
    if stale is not None:
        return Step(settled, stale)
    extended = machine.apply(
        settled,
        Event.HEARTBEAT,
        at_ns=now.wall_ns,
        actor=actor,
        lease=_lease(now, lease_ms),
        lease_ms=lease_ms,
    )
    return Step(extended, _answer(extended))


def _invalid(call: ToolCall, event: Event) -> EffectdError:
    try:
        machine.target(call.state, event, call.recorded_effect)
    except EffectdError as exc:
        return exc
    raise AssertionError(f"{event} is legal in {call.state}")  # pragma: no cover
