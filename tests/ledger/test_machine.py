"""The tool-call state machine against contract §4.2, written out independently.

The expected table below is transcribed from contract §4.2, not derived from
`machine.TRANSITIONS`; the parametrization runs over the full product of
`State`, `Event` and `Effect`, so a new enum member gets rows (and a failure
until the table says what it does) automatically.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from sidecar.errors import EffectdError, InvalidTransition, ReconciliationRequired
from sidecar.ledger import machine
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    Approval,
    Effect,
    Event,
    Lease,
    State,
    ToolCall,
    Transition,
)
from tests.ledger.builders import (
    INCARNATION,
    REF,
    TOOL,
    WALL0,
    error_result,
    ok_result,
)

S = State
E = Event

# (from state, event) -> to state, for pairs that are legal whatever the effect.
# Every pair that is not listed (and is not a retry below) is refused with
# InvalidTransition. A repeated prepare is not a transition: it leaves the
# record unchanged (contract §4.2 "prepare again") and never goes through `apply`;
# `rules.prepare` creates records itself, so PREPARE is illegal in every state.
LEGAL: dict[tuple[State, Event], State] = {
    (S.AWAITING_APPROVAL, E.APPROVE): S.PREPARED,  # contract §4.5 approve
    (S.AWAITING_APPROVAL, E.REJECT): S.COMMITTED,  # contract §4.5 reject; ADR-010 D3
    (S.PREPARED, E.START): S.STARTED,  # contract §4.2 start; ADR-010 D3
    # A repeat prepare asks for an approval before anything ran: contract §4.5
    # "only approve executes" (ADR-010 D3) holds for the call from then on.
    (S.PREPARED, E.REQUIRE_APPROVAL): S.AWAITING_APPROVAL,
    # ADR-010 R2 "change the effect to side-effect, and enter reconciliation":
    # an open call becomes a side effect for good, in the state it is in.
    (S.PREPARED, E.FORCE_SIDE_EFFECT): S.PREPARED,
    (S.AWAITING_APPROVAL, E.FORCE_SIDE_EFFECT): S.AWAITING_APPROVAL,
    (S.STARTED, E.FORCE_SIDE_EFFECT): S.STARTED,
    (S.UNKNOWN, E.FORCE_SIDE_EFFECT): S.UNKNOWN,
    (S.STARTED, E.COMMIT): S.COMMITTED,  # contract §4.2 commit OK / ERROR
    # The holder of the lease reporting back; contract §4.4 lease (only a live
    # STARTED call has a lease to extend).
    (S.STARTED, E.HEARTBEAT): S.STARTED,
    (S.STARTED, E.EXPIRE): S.UNKNOWN,  # contract §4.4 lease expired (recover too)
    (S.STARTED, E.RESTART): S.UNKNOWN,  # contract §4.4 earlier daemon incarnation
    (S.STARTED, E.REPORT_UNKNOWN): S.UNKNOWN,  # contract §4.2 agent reports unknown
    # A late commit of the attempt that holds the fencing token (contract §4.2,
    # §4.3): the holder knows the outcome, better evidence than reconciliation;
    # the ledger tests of rules.commit rely on it.
    (S.UNKNOWN, E.COMMIT): S.COMMITTED,
    (S.STARTED, E.RECONCILE_COMMITTED): S.COMMITTED,  # contract §4.6 reconcile; R3
    (S.STARTED, E.RECONCILE_NOT_EXECUTED): S.PREPARED,  # contract §4.6 reconcile
    (S.UNKNOWN, E.RECONCILE_COMMITTED): S.COMMITTED,  # contract §4.6 reconcile; R3
    (S.UNKNOWN, E.RECONCILE_NOT_EXECUTED): S.PREPARED,  # contract §4.6 reconcile
    (S.COMMITTED, E.ACKNOWLEDGE): S.COMMITTED,  # contract §4.2 acknowledge
    # A restored backup cannot know what became of an open call since it was
    # taken (contract §10.8 `effectd ctl restore`; ADR-010 D1, R3): UNKNOWN.
    (S.PREPARED, E.RESTORE): S.UNKNOWN,
    (S.AWAITING_APPROVAL, E.RESTORE): S.UNKNOWN,
    (S.STARTED, E.RESTORE): S.UNKNOWN,
}

# Where a retry means something at all: an attempt of unknown outcome.
RETRY_STATES = frozenset({S.STARTED, S.UNKNOWN})

# What contract §4.2 says of a pair: the state it leads to, or the refusal.
Expected = State | type[EffectdError]


def expected(state: State, event: Event, effect: Effect) -> Expected:
    """The contract §4.2 answer for one (state, event, effect)."""
    if event is E.RETRY and state in RETRY_STATES:
        if effect is Effect.SIDE_EFFECT:
            return ReconciliationRequired  # contract §4.2; ADR-010 D3, D6
        return S.STARTED  # contract §4.2 explicit retry of READ / IDEMPOTENT_WRITE
    return LEGAL.get((state, event), InvalidTransition)


def record(state: State, effect: Effect) -> ToolCall:
    """A plausible record in `state`, with one history entry per step so far."""
    attempt = 1 if state in (S.STARTED, S.UNKNOWN, S.COMMITTED) else 0
    history = [Transition(None, S.PREPARED, E.PREPARE, WALL0, "agent", "", 1, 0)]
    if attempt:
        history.append(
            Transition(S.PREPARED, S.STARTED, E.START, WALL0 + 1, "agent", "", 2, 1)
        )
    if state is S.UNKNOWN:
        history.append(
            Transition(S.STARTED, S.UNKNOWN, E.EXPIRE, WALL0 + 2, "effectd", "", 3, 1)
        )
    if state is S.COMMITTED:
        history.append(
            Transition(S.STARTED, S.COMMITTED, E.COMMIT, WALL0 + 2, "agent", "", 3, 1)
        )
    if state is S.AWAITING_APPROVAL:
        history = [
            Transition(None, S.AWAITING_APPROVAL, E.PREPARE, WALL0, "agent", "", 1, 0)
        ]
    lease = Lease(INCARNATION, 10**12, WALL0 + 10**12) if state is S.STARTED else None
    return ToolCall(
        ref=REF,
        tool_name=TOOL,
        effect=effect,
        state=state,
        revision=len(history),
        input_fingerprint="sha256:" + "ab" * 32,
        approval_required=state is S.AWAITING_APPROVAL,
        attempt=attempt,
        created_ns=WALL0,
        updated_ns=WALL0 + len(history),
        lease=lease,
        result=ok_result() if state is S.COMMITTED else None,
        history=tuple(history),
    )


def _rows() -> list[Any]:
    rows = []
    for state, event, effect in itertools.product(State, Event, Effect):
        rows.append(
            pytest.param(
                state,
                event,
                effect,
                expected(state, event, effect),
                id=f"{state.name}-{event.name}-{effect.name}",
            )
        )
    return rows


def _legal_rows() -> list[Any]:
    return [
        pytest.param(
            state, event, effect, to, id=f"{state.name}-{event.name}-{effect.name}"
        )
        for state, event, effect in itertools.product(State, Event, Effect)
        if isinstance(to := expected(state, event, effect), State)
    ]


@pytest.mark.parametrize(("state", "event", "effect", "want"), _rows())
def test_every_state_event_effect_has_the_design_outcome(
    state: State, event: Event, effect: Effect, want: Expected
) -> None:
    """Each (state, event, effect) leads where contract §4.2 says, or is refused with
    the class contract §4.2 names, through both `target` and `apply`."""
    call = record(state, effect)
    if isinstance(want, State):
        assert machine.target(state, event, effect) is want
        assert machine.apply(call, event, at_ns=WALL0 + 99, actor="t").state is want
        return
    with pytest.raises(EffectdError) as raised:
        machine.target(state, event, effect)
    assert type(raised.value) is want
    with pytest.raises(want):
        machine.apply(call, event, at_ns=WALL0 + 99, actor="t")


@pytest.mark.parametrize(("state", "event", "effect", "to"), _legal_rows())
def test_apply_bumps_revision_records_history_and_changes_only_what_it_is_told(
    state: State, event: Event, effect: Effect, to: State
) -> None:
    """A legal `apply` adds exactly 1 to the revision, appends one history entry
    (none for HEARTBEAT) and leaves every field it was not given unchanged."""
    # contract §4.3: an increasing revision; history with time, actor, reason.
    call = record(state, effect)
    changes: dict[str, Any] = {"attempt": call.attempt + 1, "acknowledged": True}
    after = machine.apply(
        call, event, at_ns=WALL0 + 99, actor="tester", reason="because", **changes
    )

    assert after.revision == call.revision + 1
    assert after.state is to
    assert after.updated_ns == WALL0 + 99
    if event is E.HEARTBEAT:
        assert after.history == call.history
    else:
        assert after.history[:-1] == call.history
        assert after.history[-1] == Transition(
            from_state=state,
            to_state=to,
            event=event,
            at_ns=WALL0 + 99,
            actor="tester",
            reason="because",
            revision=call.revision + 1,
            attempt=call.attempt + 1,
        )
    moved = {"state", "revision", "updated_ns", "history", *changes}
    for f in dataclasses.fields(ToolCall):
        if f.name in changes:
            assert getattr(after, f.name) == changes[f.name], f.name
        elif f.name not in moved:
            assert getattr(after, f.name) == getattr(call, f.name), f.name


@pytest.mark.parametrize(("state", "event", "effect", "to"), _legal_rows())
def test_apply_without_changes_records_the_current_attempt(
    state: State, event: Event, effect: Effect, to: State
) -> None:
    """Without an attempt change the history entry carries the record's attempt
    and every non-bookkeeping field stays as it was."""
    call = record(state, effect)
    after = machine.apply(call, event, at_ns=WALL0 + 5, actor="tester")
    if event is not E.HEARTBEAT:
        assert after.history[-1].attempt == call.attempt
        assert after.history[-1].reason == ""
    assert after == dataclasses.replace(
        call,
        state=to,
        revision=call.revision + 1,
        updated_ns=WALL0 + 5,
        history=after.history,
    )


def test_a_refused_apply_leaves_the_record_as_it_was() -> None:
    """An illegal event raises and the (frozen) input record is untouched."""
    # contract §4.2: COMMITTED is final; only acknowledge is allowed.
    call = record(S.COMMITTED, Effect.READ)
    snapshot = dataclasses.replace(call)
    with pytest.raises(InvalidTransition) as raised:
        machine.apply(call, E.START, at_ns=WALL0 + 1, actor="t")
    assert call == snapshot
    assert raised.value.metadata == {"state": "COMMITTED", "event": "start"}


def test_reject_stores_the_approval_rejected_error() -> None:
    """A rejection commits the record with outcome ERROR APPROVAL_REJECTED, which
    the record then reports as rejected."""
    # contract §4.5 reject -> COMMITTED, outcome ERROR APPROVAL_REJECTED.
    after = machine.apply(
        record(S.AWAITING_APPROVAL, Effect.SIDE_EFFECT),
        E.REJECT,
        at_ns=WALL0 + 1,
        actor="approver",
        result=error_result(APPROVAL_REJECTED),
    )
    assert after.state is S.COMMITTED
    assert after.rejected


@pytest.mark.parametrize("approved", [None, False, True], ids=["none", "no", "yes"])
def test_a_call_that_requires_approval_is_prepared_only_once_approved(
    approved: bool | None,
) -> None:
    """contract §4.5, ADR-010 D3 "only approve executes": a call made UNKNOWN
    by a restore while it awaited approval, then found never executed, waits
    for its approver again; one approved before goes back to PREPARED."""
    waiting = record(S.AWAITING_APPROVAL, Effect.SIDE_EFFECT)
    if approved is not None:
        decision = Approval(approved, "ada", "", WALL0, waiting.input_fingerprint, 1)
        waiting = dataclasses.replace(waiting, approval=decision)
    lost = machine.apply(waiting, E.RESTORE, at_ns=WALL0 + 1, actor="olga")
    assert lost.state is S.UNKNOWN
    back = machine.apply(lost, E.RECONCILE_NOT_EXECUTED, at_ns=WALL0 + 2, actor="o")
    assert back.state is (S.PREPARED if approved else S.AWAITING_APPROVAL)
    assert back.history[-1].to_state is back.state
