"""The vocabulary of the ledger's rules (contract §4, §5): the moment a rule
runs (`Now`), its reply (`Answer`, or a refusal) with the record to store
(`Step`), and what every rule does first: settle a lapsed lease into UNKNOWN,
record an effect the policy forces, and decide what a record means for its
caller. The rules of each request (`sidecar.ledger.rules`) are built from
these.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.errors import EffectdError, RevisionConflict, StaleAttempt
from sidecar.ledger import machine, ownership
from sidecar.ledger.model import (
    Decision,
    Effect,
    Event,
    Lease,
    State,
    ToolCall,
)
from sidecar.ledger.policy import Policy

AGENT = "agent"
DAEMON = "effectd"


@dataclass(frozen=True, slots=True)
class Now:
    """The moment a rule runs: both clocks, the daemon's incarnation and, on
    a store other daemons share, their registrations (`ledger.ownership`)."""

    wall_ns: int
    monotonic_ns: int
    incarnation: int
    # None: the store is exclusive, every other incarnation is an earlier
    # one, gone.
    peers: ownership.Peers | None = None


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


def new_lease(now: Now, lease_ms: int) -> Lease:
    """A lease of `lease_ms` from `now`, in this incarnation."""
    span = lease_ms * 1_000_000
    return Lease(now.incarnation, now.monotonic_ns + span, now.wall_ns + span)


def settle(call: ToolCall, now: Now) -> ToolCall:
    """A STARTED call whose lease is no longer live becomes UNKNOWN.

    A lease whose holder is gone is never live: an earlier incarnation of an
    exclusive store's daemon, or, on a shared store, a holder that restarted
    or whose registration lapsed or ended. Whoever held it may have executed
    the call (ADR-010 D3). Who judges what is `ownership.judge`.
    """
    if call.state is not State.STARTED or call.lease is None:
        return call
    verdict = _judge(call, now)
    match verdict.verdict:
        case ownership.Verdict.LIVE:
            return call
        case ownership.Verdict.RESTARTED:
            event, reason = (
                Event.RESTART,
                "started under an earlier daemon incarnation",
            )
        case ownership.Verdict.LAPSED:
            event, reason = (
                Event.EXPIRE,
                "the registration of the daemon that started it lapsed",
            )
        case ownership.Verdict.EXPIRED:
            event, reason = Event.EXPIRE, "lease expired"
    # The outcome is unknown from the lease's end (or its holder's), however
    # late it is noticed.
    return machine.apply(
        call,
        event,
        at_ns=now.wall_ns,
        actor=DAEMON,
        reason=reason,
        lease=None,
        unknown_since_ns=verdict.since_ns,
    )


def holder_restarted(call: ToolCall, now: Now) -> bool:
    """Whether `call` is STARTED under a lease whose holder restarted (an
    earlier incarnation, on an exclusive store)."""
    if call.state is not State.STARTED or call.lease is None:
        return False
    return _judge(call, now).verdict is ownership.Verdict.RESTARTED


def _judge(call: ToolCall, now: Now) -> ownership.Judgement:
    """The verdict on the lease of STARTED `call`, last changed by the start
    or heartbeat that granted it."""
    assert call.lease is not None
    return ownership.judge(
        call.lease,
        incarnation=now.incarnation,
        wall_ns=now.wall_ns,
        monotonic_ns=now.monotonic_ns,
        peers=now.peers,
        granted_ns=call.updated_ns,
    )


def decide(call: ToolCall, policy: Policy | None = None) -> Decision:
    """The decision for a settled record (contract §5.1), under `policy`."""
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


def answer_for(
    call: ToolCall, *, held: bool = False, policy: Policy | None = None
) -> Answer:
    """The answer for a settled record; `held`: the caller holds the attempt."""
    decision = decide(call, policy)
    retry = call.state is State.UNKNOWN and decision is Decision.EXECUTE
    return Answer(decision, call, attempt_held=held, retry_required=retry)


def begin(
    call: ToolCall, now: Now, lease_ms: int, event: Event, actor: str
) -> ToolCall:
    """`call` with a new attempt started by `event`, under a fresh lease."""
    return machine.apply(
        call,
        event,
        at_ns=now.wall_ns,
        actor=actor,
        attempt=call.attempt + 1,
        lease=new_lease(now, lease_ms),
        lease_ms=lease_ms,
    )


def check_revision(call: ToolCall | None, expected: int | None) -> None:
    """Refuse with RevisionConflict unless the record is at `expected`."""
    current = 0 if call is None else call.revision
    if expected is not None and expected != current:
        raise RevisionConflict(
            f"expected revision {expected}, the record is at {current}", current
        )


def check_attempt(call: ToolCall, attempt: int) -> EffectdError | None:
    """The refusal of an `attempt` that does not hold the call, if it does not."""
    if attempt != call.attempt or call.attempt == 0:
        return StaleAttempt(
            f"attempt {attempt} does not hold the call "
            f"(current attempt {call.attempt})",
            {"currentAttempt": str(call.attempt)},
        )
    return None


def moved_on(call: ToolCall, attempt: int) -> EffectdError | None:
    """The refusal of an `attempt` that a reconciliation moved the call on
    from ("never executed": PREPARED again, its attempt counted), if so: it
    no longer holds the call (docs/ledger.md), rather than the state's."""
    if call.state is State.PREPARED and 0 < attempt <= call.attempt:
        return StaleAttempt(
            f"attempt {attempt} no longer holds the call: it was reconciled "
            "as never executed",
            {"currentAttempt": str(call.attempt)},
        )
    return None


def invalid(call: ToolCall, event: Event) -> EffectdError:
    """The state machine's refusal of `event` in the call's state."""
    try:
        machine.target(call.state, event, call.recorded_effect)
    except EffectdError as exc:
        return exc
    raise AssertionError(f"{event} is legal in {call.state}")  # pragma: no cover
