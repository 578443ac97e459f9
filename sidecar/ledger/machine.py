"""The tool-call state machine of contract §4.2 (ADR-010 D2, D3) as one table.

`TRANSITIONS` lists every legal (state, event) pair; `apply` is the only way
a record changes state. It checks the pair, bumps the revision and appends
the history entry, so no caller can forget either.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sidecar.errors import InvalidTransition, ReconciliationRequired
from sidecar.ledger.model import Effect, Event, State, ToolCall, Transition

# (from state, event) -> to state. A pair that is missing is illegal.
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.AWAITING_APPROVAL, Event.APPROVE): State.PREPARED,
    (State.AWAITING_APPROVAL, Event.REJECT): State.COMMITTED,
    (State.PREPARED, Event.START): State.STARTED,
    # Approval asked for on a repeat prepare, before anything ran (contract §4.2).
    (State.PREPARED, Event.REQUIRE_APPROVAL): State.AWAITING_APPROVAL,
    (State.STARTED, Event.COMMIT): State.COMMITTED,
    (State.STARTED, Event.HEARTBEAT): State.STARTED,
    (State.STARTED, Event.EXPIRE): State.UNKNOWN,
    (State.STARTED, Event.RESTART): State.UNKNOWN,
    (State.STARTED, Event.REPORT_UNKNOWN): State.UNKNOWN,
    (State.STARTED, Event.RETRY): State.STARTED,
    (State.UNKNOWN, Event.RETRY): State.STARTED,
    # A late commit from the attempt that still holds the call: it knows the
    # outcome, which is better evidence than any reconciliation.
    (State.UNKNOWN, Event.COMMIT): State.COMMITTED,
    (State.STARTED, Event.RECONCILE_COMMITTED): State.COMMITTED,
    (State.STARTED, Event.RECONCILE_NOT_EXECUTED): State.PREPARED,
    (State.UNKNOWN, Event.RECONCILE_COMMITTED): State.COMMITTED,
    (State.UNKNOWN, Event.RECONCILE_NOT_EXECUTED): State.PREPARED,
    (State.COMMITTED, Event.ACKNOWLEDGE): State.COMMITTED,
    # ADR-010 R2: an open call becomes a SIDE_EFFECT for good; nothing else
    # changes (a committed one has nothing left to decide).
    (State.PREPARED, Event.FORCE_SIDE_EFFECT): State.PREPARED,
    (State.AWAITING_APPROVAL, Event.FORCE_SIDE_EFFECT): State.AWAITING_APPROVAL,
    (State.STARTED, Event.FORCE_SIDE_EFFECT): State.STARTED,
    (State.UNKNOWN, Event.FORCE_SIDE_EFFECT): State.UNKNOWN,
    # A restored store cannot know what became of an open call after the
    # backup (`ledger.restore`).
    (State.PREPARED, Event.RESTORE): State.UNKNOWN,
    (State.AWAITING_APPROVAL, Event.RESTORE): State.UNKNOWN,
    (State.STARTED, Event.RESTORE): State.UNKNOWN,
}

# Events that change nothing a reader of the history needs.
_UNRECORDED = frozenset({Event.HEARTBEAT})


def target(state: State, event: Event, effect: Effect) -> State:
    """The state `event` leads to from `state`, or the refusal.

    Raises:
        ReconciliationRequired: a retry of a SIDE_EFFECT whose outcome is
            unknown (ADR-010 D3, D6): only reconciliation leaves that state.
        InvalidTransition: any other pair that the table does not list.
    """
    unresolved = state in (State.STARTED, State.UNKNOWN)
    if event is Event.RETRY and effect is Effect.SIDE_EFFECT and unresolved:
        raise ReconciliationRequired(
            "a side effect whose outcome is unknown is never retried; reconcile it",
            {"state": state.name},
        )
    to = TRANSITIONS.get((state, event))
    if to is None:
        raise InvalidTransition(
            f"{event.value} is not allowed in state {state.name}",
            {"state": state.name, "event": event.value},
        )
    return to


def _unapproved(call: ToolCall) -> bool:
    return (
        call.state is not State.AWAITING_APPROVAL
        and call.approval_required
        and (call.approval is None or not call.approval.approved)
    )


def apply(
    call: ToolCall,
    event: Event,
    *,
    at_ns: int,
    actor: str,
    reason: str = "",
    **changes: Any,
) -> ToolCall:
    """Returns `call` after `event`, with `changes` applied, revision + 1 and
    the transition in its history."""
    to = target(call.state, event, call.recorded_effect)
    if to is State.PREPARED and _unapproved(call):
        # Only an approval leaves AWAITING_APPROVAL: a call that was never
        # approved (made UNKNOWN by a restore while it waited) and is found
        # never executed waits for its approver again.
        to = State.AWAITING_APPROVAL
    if to is not State.UNKNOWN:
        # Meaningful only while the outcome is unknown (ADR-010 D3).
        changes.setdefault("unknown_since_ns", 0)
    revision = call.revision + 1
    attempt = changes.get("attempt", call.attempt)
    if to is State.COMMITTED and call.state is not State.COMMITTED:
        # Settled: the kept input goes unless the caller keeps it for the
        # retention window (`kept_inputs.settled`); the fingerprint stays.
        changes.setdefault("kept_input", None)
    history = call.history
    if event not in _UNRECORDED:
        entry = Transition(
            call.state, to, event, at_ns, actor, reason, revision, attempt
        )
        history = (*history, entry)
    return dataclasses.replace(
        call, **changes, state=to, revision=revision, updated_ns=at_ns, history=history
    )
