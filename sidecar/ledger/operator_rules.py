"""What approvers and operators do to a record, as pure functions (contract §4.5, §4.6).

An approval decides a call in AWAITING_APPROVAL and is bound to the revision
and input fingerprint the approver saw: approve makes it PREPARED, reject
commits it with the error result APPROVAL_REJECTED. A reconciliation resolves
a STARTED or UNKNOWN call from evidence found in the target system: the
result found there commits it, a verified "never ran" makes it PREPARED
again (ADR-010 D3, R3), but only once the call has been UNKNOWN for the
policy's quarantine or the operator confirms that its attempt is dead: an
expired lease means that the holder stopped heartbeating, not that it
stopped running, and a "never ran" found while it still runs would let the
call run twice. Both are compare-and-swap on the revision, so of two
operators deciding one record only the first succeeds. Like `rules`, each
function returns a `Step`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.errors import (
    EffectdError,
    FieldViolation,
    InputMismatch,
    InvalidArgument,
    InvalidTransition,
    ReconcileQuarantine,
    RevisionConflict,
    StaleAttempt,
)
from sidecar.ledger import fingerprint, kept_inputs, machine, rules
from sidecar.ledger.channel_results import result_fault
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    Approval,
    Effect,
    Event,
    Outcome,
    Reconciliation,
    Resolution,
    Result,
    State,
    ToolCall,
)
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Answer, Now, Step


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """DecideApproval as the rules see it."""

    approve: bool
    approver: str
    reason: str
    expected_revision: int
    input_fingerprint: str


@dataclass(frozen=True, slots=True)
class ReconcileOrder:
    """Reconcile as the rules see it; `result` is None for "never executed"."""

    expected_revision: int
    result: Result | None
    operator: str
    reason: str
    evidence: str
    # The operator's word that this attempt is dead (its process is gone):
    # "never executed" is then accepted before the quarantine ends; 0: none.
    confirmed_dead_attempt: int = 0

    @property
    def resolution(self) -> Resolution:
        return Resolution.NOT_EXECUTED if self.result is None else Resolution.COMMITTED


def rejection_result(approver: str, reason: str) -> Result:
    """The error result a rejected call is committed with (contract §4.5 reject)."""
    message = f"rejected by {approver}: {reason}"
    digest = fingerprint.result_digest(Outcome.ERROR, None, APPROVAL_REJECTED, message)
    return Result(Outcome.ERROR, None, APPROVAL_REJECTED, message, digest)


def _revision_conflict(call: ToolCall, expected: int) -> EffectdError | None:
    if expected == call.revision:
        return None
    return RevisionConflict(
        f"expected revision {expected}, the record is at {call.revision}",
        call.revision,
    )


def _invalid(call: ToolCall, event: Event) -> EffectdError:
    try:
        machine.target(call.state, event, call.recorded_effect)
    except EffectdError as exc:
        return exc
    raise AssertionError(f"{event} is legal in {call.state}")  # pragma: no cover


def enter_reconciliation(call: ToolCall, now: Now, operator: str, reason: str) -> Step:
    """ADR-010 R2 "enter reconciliation": an open call of a tool found to
    duplicate its effect becomes a SIDE_EFFECT for good, in the state it is
    in. One whose outcome is unknown then answers RECONCILE until an operator
    reconciles it, whatever the policy says later; one that never ran runs at
    most once and is never retried. A call already a SIDE_EFFECT is answered
    unchanged (the same object); a committed one is INVALID_TRANSITION.
    """
    if call.state is State.COMMITTED:
        return Step(call, _invalid(call, Event.FORCE_SIDE_EFFECT))
    if call.recorded_effect is Effect.SIDE_EFFECT:
        return Step(call, Answer(rules.decide(call), call))
    forced = machine.apply(
        call,
        Event.FORCE_SIDE_EFFECT,
        at_ns=now.wall_ns,
        actor=operator,
        reason=reason,
        forced_effect=Effect.SIDE_EFFECT,
    )
    return Step(forced, Answer(rules.decide(forced), forced))


def quarantine_end_ns(call: ToolCall, policy: Policy) -> int:
    """When `policy`'s quarantine of the call's unknown outcome ends (wall
    clock): from then on "never executed" needs no confirmed dead attempt."""
    return call.outcome_unknown_since_ns + policy.reconcile_quarantine_ns(call.lease_ms)


def _wrong_order(call: ToolCall, order: ReconcileOrder) -> EffectdError | None:
    """A confirmation naming another attempt than the call's, or a result
    the call's channel could never return."""
    confirmed = order.confirmed_dead_attempt
    if confirmed and confirmed != call.attempt:
        return StaleAttempt(
            f"attempt {confirmed} is not the call's attempt: confirm that "
            f"attempt {call.attempt} is dead",
            {"currentAttempt": str(call.attempt)},
        )
    fault = None if order.result is None else result_fault(call.channel, order.result)
    if fault is not None:
        return InvalidArgument([FieldViolation("result", fault)])
    return None


def _quarantined(call: ToolCall, now: Now, policy: Policy) -> EffectdError | None:
    """The refusal of "never executed" while the call is in quarantine."""
    quarantine = policy.reconcile_quarantine_ns(call.lease_ms)
    unknown_for = max(0, now.wall_ns - call.outcome_unknown_since_ns)
    if unknown_for >= quarantine:
        return None
    left = quarantine - unknown_for
    return ReconcileQuarantine(
        f"the outcome of attempt {call.attempt} has been unknown for "
        f"{_seconds(unknown_for)}: its holder may still be running. "
        f'"never executed" is accepted after a quarantine of '
        f"{_seconds(quarantine)} ({_seconds(left)} left), or now with the "
        f"confirmation that attempt {call.attempt} is dead "
        f"(confirmed_dead_attempt = {call.attempt})",
        {
            "attempt": str(call.attempt),
            "quarantineMs": str(quarantine // 1_000_000),
            "remainingMs": str(-(-left // 1_000_000)),
        },
    )


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.1f} s"


def decide_approval(
    call: ToolCall,
    now: Now,
    decision: ApprovalDecision,
    policy: Policy | None = None,
) -> Step:
    """DecideApproval: approve (PREPARED) or reject (COMMITTED, error result;
    the kept input goes unless `policy` keeps settled inputs).

    Refused, changing nothing: another revision than the approver saw
    (REVISION_CONFLICT), another input fingerprint (INPUT_MISMATCH), a call
    not in AWAITING_APPROVAL (INVALID_TRANSITION).
    """
    conflict = _revision_conflict(call, decision.expected_revision)
    if conflict is not None:
        return Step(call, conflict)
    if decision.input_fingerprint != call.input_fingerprint:
        return Step(
            call,
            InputMismatch(
                "the approval was given for another input than the call's",
                {"inputFingerprint": call.input_fingerprint},
            ),
        )
    event = Event.APPROVE if decision.approve else Event.REJECT
    if call.state is not State.AWAITING_APPROVAL:
        return Step(call, _invalid(call, event))
    approval = Approval(
        approved=decision.approve,
        approver=decision.approver,
        reason=decision.reason,
        at_ns=now.wall_ns,
        input_fingerprint=call.input_fingerprint,
        revision=call.revision,
    )
    changes: dict[str, object] = {"approval": approval}
    if not decision.approve:
        changes["result"] = rejection_result(decision.approver, decision.reason)
        changes["kept_input"] = kept_inputs.settled(call, policy)
    decided = machine.apply(
        call,
        event,
        at_ns=now.wall_ns,
        actor=decision.approver,
        reason=decision.reason,
        **changes,
    )
    return Step(decided, Answer(rules.decide(decided), decided))


def reconcile(
    call: ToolCall, now: Now, order: ReconcileOrder, policy: Policy | None = None
) -> Step:
    """Reconcile: COMMITTED with the result found, or PREPARED when verified
    never executed; the evidence is kept on the record.

    The revision is compared with the record as stored (the one the operator
    saw); a STARTED call whose lease ran out is then settled to UNKNOWN first,
    so its history shows the expiry. Refused, changing nothing: another
    revision (REVISION_CONFLICT); a state other than STARTED or UNKNOWN, or
    "never executed" while an attempt still holds a live lease and may yet
    execute (INVALID_TRANSITION); a confirmation naming another attempt than
    the call's (STALE_ATTEMPT); "never executed" before the call has been
    UNKNOWN for `policy`'s quarantine, unless its attempt is confirmed dead
    (RECONCILE_QUARANTINE); a result the call's channel could never return
    (INVALID_ARGUMENT, a violation of `result` saying the shape wanted).
    """
    conflict = _revision_conflict(call, order.expected_revision)
    if conflict is not None:
        return Step(call, conflict)
    event = (
        Event.RECONCILE_NOT_EXECUTED
        if order.result is None
        else Event.RECONCILE_COMMITTED
    )
    if call.state not in (State.STARTED, State.UNKNOWN):
        return Step(call, _invalid(call, event))
    wrong = _wrong_order(call, order)
    if wrong is not None:
        return Step(call, wrong)
    confirmed = order.confirmed_dead_attempt
    settled = rules.settle(call, now)
    if settled.state is State.STARTED and order.result is None:
        return Step(
            call,
            InvalidTransition(
                "an attempt holds a live lease and may still execute the call: "
                "it cannot be verified as never executed yet",
                {"state": call.state.name, "event": event.value, "lease": "live"},
            ),
        )
    if order.result is None and not confirmed:
        early = _quarantined(settled, now, policy or Policy())
        if early is not None:
            return Step(call, early)
    entry = Reconciliation(
        resolution=order.resolution,
        operator=order.operator,
        reason=order.reason,
        evidence=order.evidence,
        at_ns=now.wall_ns,
        from_state=call.state,
        revision=call.revision,
        attempt=call.attempt,
    )
    changes: dict[str, object] = {
        "lease": None,
        "reconciliations": (*call.reconciliations, entry),
    }
    if order.result is not None:
        changes["result"] = order.result
        changes["kept_input"] = kept_inputs.settled(call, policy)
    resolved = machine.apply(
        settled,
        event,
        at_ns=now.wall_ns,
        actor=order.operator,
        reason=order.reason,
        **changes,
    )
    return Step(resolved, Answer(rules.decide(resolved), resolved))
