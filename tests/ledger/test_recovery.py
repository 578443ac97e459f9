"""The recovery plan of contract §6.1 (ADR-010 D3) as tables, and its guard.

Every state x effect x approval path has its row. The guard: over random
histories built by the rules, recovery never answers EXECUTE for a call that
was STARTED as a side effect (unless an operator verified it never ran); its
negative control is a broken plan that the guard must catch.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest

from sidecar.ledger import machine, recovery, rules
from sidecar.ledger.model import APPROVAL_REJECTED, Effect, Event, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.recovery import Plan, PlanItem, RecoveryAction
from sidecar.ledger.rules import Now
from sidecar.storage.records import decode_call, encode_call
from tests.ledger.builders import (
    LEASE_MS,
    LEASE_NS,
    MAX_ATTEMPTS,
    TOOL,
    WALL0,
    answer,
    awaiting,
    committed,
    error_result,
    later,
    moment,
    ok_result,
    prepared,
    rejected,
    spec,
    started,
    unknown,
)

R, W, SE = Effect.READ, Effect.IDEMPOTENT_WRITE, Effect.SIDE_EFFECT
A = RecoveryAction
POLICY = Policy()


def approved(effect: Effect) -> ToolCall:
    return machine.apply(
        awaiting(effect), Event.APPROVE, at_ns=WALL0, actor="approver", reason="ok"
    )


def _start(call: ToolCall) -> ToolCall:
    return answer(
        rules.start(
            call,
            moment(),
            lease_ms=LEASE_MS,
            retry=False,
            policy=Policy(max_attempts=MAX_ATTEMPTS),
            expected_revision=None,
        )
    ).call


def approved_started(effect: Effect) -> ToolCall:
    return _start(approved(effect))


def approved_unknown(effect: Effect) -> ToolCall:
    call = approved_started(effect)
    return rules.report_unknown(call, moment(), attempt=1, reason="lost").call


def approved_committed(effect: Effect) -> ToolCall:
    call = approved_started(effect)
    return rules.commit(
        call, moment(), attempt=1, result=ok_result(), expected_revision=None
    ).call


def reconciled_not_executed(effect: Effect) -> ToolCall:
    return machine.apply(
        unknown(effect),
        Event.RECONCILE_NOT_EXECUTED,
        at_ns=WALL0,
        actor="operator",
        reason="not in the target system",
    )


def reconciled_committed(effect: Effect) -> ToolCall:
    return machine.apply(
        unknown(effect),
        Event.RECONCILE_COMMITTED,
        at_ns=WALL0,
        actor="operator",
        result=ok_result(),
    )


def _acknowledged(call: ToolCall) -> ToolCall:
    return machine.apply(
        call, Event.ACKNOWLEDGE, at_ns=WALL0, actor="agent", acknowledged=True
    )


def acknowledged(effect: Effect) -> ToolCall:
    return _acknowledged(committed(effect))


def rejected_acknowledged(effect: Effect) -> ToolCall:
    return _acknowledged(rejected(effect))


def _unresolved(effect: Effect) -> RecoveryAction:
    # ADR-010 D3: started + side-effect -> manual reconciliation; read /
    # idempotent-write retries need an explicit orchestration policy.
    return A.RECONCILE if effect is SE else A.RETRY_NEEDS_POLICY


@dataclass(frozen=True, slots=True)
class Row:
    """A path through the rules, the record it leaves, and its recovery action."""

    path: str
    approval_required: bool
    rejected: bool
    build: Callable[[Effect], ToolCall]
    want: Callable[[Effect], RecoveryAction]


def _always(action: RecoveryAction) -> Callable[[Effect], RecoveryAction]:
    return lambda _: action


ROWS = [
    # contract §6.1: never started -> EXECUTE.
    Row("prepared", False, False, prepared, _always(A.EXECUTE)),
    Row("started", False, False, started, _unresolved),
    Row("unknown", False, False, unknown, _unresolved),
    # ADR-010 D3 "committed + result: the stored result; do NOT call the tool".
    Row("committed", False, False, committed, _always(A.REPLAY_RESULT)),
    # ADR-010 D1 "a committed result is not appended again on recovery": once
    # acknowledged as delivered, there is nothing to append.
    Row("acknowledged", False, False, acknowledged, _always(A.ALREADY_DELIVERED)),
    # ADR-010 D3 "awaiting_approval: no decision yet -> stay interrupted".
    Row("awaiting", True, False, awaiting, _always(A.WAIT_FOR_APPROVAL)),
    # contract §6.1: approved -> EXECUTE; ADR-010 D3 "only approve executes".
    Row("approved", True, False, approved, _always(A.EXECUTE)),
    Row("approved-started", True, False, approved_started, _unresolved),
    Row("approved-unknown", True, False, approved_unknown, _unresolved),
    Row(
        "approved-committed", True, False, approved_committed, _always(A.REPLAY_RESULT)
    ),
    # ADR-010 D3 "reject -> produce an error result".
    Row("rejected", True, True, rejected, _always(A.ERROR_RESULT)),
    Row(
        "rejected-acknowledged",
        True,
        True,
        rejected_acknowledged,
        _always(A.ALREADY_DELIVERED),
    ),
    # contract §4.6 reconcile: verified not executed -> PREPARED, may run again.
    Row(
        "reconciled-not-executed",
        False,
        False,
        reconciled_not_executed,
        _always(A.EXECUTE),
    ),
    # contract §4.6 reconcile: the result found in the target system.
    Row(
        "reconciled-committed",
        False,
        False,
        reconciled_committed,
        _always(A.REPLAY_RESULT),
    ),
]


@pytest.mark.parametrize("effect", list(Effect), ids=lambda e: e.name)
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.path)
def test_every_state_effect_and_approval_has_its_action(
    row: Row, effect: Effect
) -> None:
    """Each record the rules can reach gets the action of its contract §6.1 row."""
    call = row.build(effect)
    assert (call.approval_required, call.rejected) == (
        row.approval_required,
        row.rejected,
    )
    assert recovery.action(call, effect) is row.want(effect)
    [item] = recovery.plan([call], POLICY).items
    assert item == PlanItem(call, row.want(effect), effect)


def test_the_rows_cover_every_state() -> None:
    """The table reaches each state with and without approval where possible."""
    reached = {(r.build(e).state, r.approval_required) for r in ROWS for e in Effect}
    assert reached >= {(s, False) for s in State if s is not State.AWAITING_APPROVAL}
    assert reached >= {(s, True) for s in State}


@pytest.mark.parametrize(
    ("build", "interrupted"),
    [
        (prepared, False),
        (committed, False),
        (rejected, False),
        (awaiting, True),  # ADR-010 D3 awaiting approval stays interrupted
        (unknown, True),  # for the side effect only, see below
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_a_run_is_interrupted_by_reconcile_or_approval(
    build: Callable[[Effect], ToolCall], interrupted: bool
) -> None:
    """A plan is interrupted when any item is RECONCILE or WAIT_FOR_APPROVAL."""
    calls = [prepared(R), committed(W), build(SE)]
    assert recovery.plan(calls, POLICY).interrupted is interrupted
    assert not recovery.plan([unknown(R), unknown(W)], POLICY).interrupted
    assert not Plan(()).interrupted


@pytest.mark.parametrize("effect", [R, W], ids=lambda e: e.name)
def test_a_forced_side_effect_override_turns_a_retry_into_reconcile(
    effect: Effect,
) -> None:
    """When the operator forced the tool to SIDE_EFFECT, an unknown READ /
    IDEMPOTENT_WRITE is RECONCILE, not RETRY_NEEDS_POLICY."""
    # ADR-010 R2 "change the effect to side-effect, and enter reconciliation".
    forced = Policy(effect_overrides=MappingProxyType({TOOL: SE}))
    [item] = recovery.plan([unknown(effect)], forced).items
    assert (item.action, item.effect) == (A.RECONCILE, SE)
    assert recovery.plan([unknown(effect)], forced).interrupted


def test_a_plan_changes_no_record() -> None:
    """The plan holds the records as given: recovery starts nothing."""
    calls = [r.build(e) for r in ROWS for e in Effect]
    items = recovery.plan(calls, POLICY).items
    assert [item.call for item in items] == calls
    assert all(item.call is call for item, call in zip(items, calls, strict=True))


# --- the guard: no EXECUTE for a side effect that was ever started -----------

Op = Callable[[ToolCall, Now, random.Random], tuple[ToolCall, Now]]


def _op_start(call: ToolCall, now: Now, rng: random.Random) -> tuple[ToolCall, Now]:
    step = rules.start(
        call,
        now,
        lease_ms=LEASE_MS,
        retry=rng.random() < 0.5,
        policy=Policy(max_attempts=MAX_ATTEMPTS),
        expected_revision=None,
    )
    return step.call, now


def _op_unknown(call: ToolCall, now: Now, _: random.Random) -> tuple[ToolCall, Now]:
    step = rules.report_unknown(call, now, attempt=call.attempt, reason="lost")
    return step.call, now


def _op_commit(call: ToolCall, now: Now, _: random.Random) -> tuple[ToolCall, Now]:
    step = rules.commit(
        call, now, attempt=call.attempt, result=ok_result(), expected_revision=None
    )
    return step.call, now


def _op_expire(call: ToolCall, now: Now, _: random.Random) -> tuple[ToolCall, Now]:
    now = later(now, LEASE_NS)
    return rules.settle(call, now), now


def _op_restart(call: ToolCall, now: Now, _: random.Random) -> tuple[ToolCall, Now]:
    now = Now(now.wall_ns + 1, now.monotonic_ns // 2, now.incarnation + 1)
    return rules.settle(call, now), now


def _event(event: Event, **changes: Any) -> Op:
    def op(call: ToolCall, now: Now, _: random.Random) -> tuple[ToolCall, Now]:
        if (call.state, event) not in machine.TRANSITIONS:
            return call, now
        return (
            machine.apply(call, event, at_ns=now.wall_ns, actor="test", **changes),
            now,
        )

    return op


OPS: list[Op] = [
    _op_start,
    _op_start,
    _op_unknown,
    _op_commit,
    _op_expire,
    _op_restart,
    _event(Event.APPROVE),
    _event(Event.REJECT, result=error_result(APPROVAL_REJECTED, "no")),
    _event(Event.RECONCILE_NOT_EXECUTED, lease=None),
    _event(Event.RECONCILE_COMMITTED, lease=None, result=ok_result()),
    _event(Event.ACKNOWLEDGE, acknowledged=True),
]


def random_history(rng: random.Random) -> tuple[ToolCall, Now]:
    """A record after a random walk through the rules, and the walk's moment."""
    effect = rng.choice(list(Effect))
    now = moment()
    call = rules.prepare(
        None, spec(effect, require_approval=rng.random() < 0.3), now
    ).call
    for _ in range(rng.randrange(8)):
        call, now = rng.choice(OPS)(call, now, rng)
    # Recovery runs in the same incarnation, or after a restart.
    recovered_at = rng.choice(
        [later(now, 1), Now(now.wall_ns + 1, 0, now.incarnation + 1)]
    )
    return decode_call(encode_call(rules.settle(call, recovered_at))), recovered_at


def _started_side_effect_unresolved(call: ToolCall, effect: Effect) -> bool:
    """STARTED as a side effect, and no operator verified since that it never ran."""
    if effect is not SE:
        return False
    verdict = None
    for t in call.history:
        if t.event in (Event.START, Event.RETRY):
            verdict = "started"
        elif t.event is Event.RECONCILE_NOT_EXECUTED:
            verdict = "verified not executed"
    return verdict == "started"


Action = Callable[[ToolCall, Effect], RecoveryAction]


def execute_violations(act: Action, seed: int, walks: int = 400) -> list[str]:
    """Calls of random histories that were STARTED as a side effect (and not
    verified as never run) but that `act` tells the agent to EXECUTE."""
    rng = random.Random(seed)  # noqa: S311 (reproducible walks, not secrets)
    found = []
    for policy in (POLICY, Policy(effect_overrides=MappingProxyType({TOOL: SE}))):
        for _ in range(walks):
            call, _ = random_history(rng)
            effect = policy.effect_of(call.tool_name, call.effect)
            action = act(call, effect)
            if action is A.EXECUTE and _started_side_effect_unresolved(call, effect):
                found.append(
                    f"{call.state.name}: {[t.event.value for t in call.history]}"
                )
            if call.state in (State.STARTED, State.UNKNOWN) and action is A.EXECUTE:
                found.append(f"EXECUTE for {call.state.name} {effect.name}")
    return found


def test_recovery_never_executes_a_started_side_effect() -> None:
    """Over random histories, no call ever STARTED as a side effect gets EXECUTE
    (ADR-010 D1, D3), and no STARTED / UNKNOWN call gets EXECUTE at all."""
    seed = secrets.randbits(32)
    print(f"seed={seed}")
    assert execute_violations(recovery.action, seed) == []


def _executes_unknown_side_effects(call: ToolCall, effect: Effect) -> RecoveryAction:
    """Broken on purpose: an UNKNOWN side effect is 'retried' by execution."""
    if call.state is State.UNKNOWN and effect is SE:
        return A.EXECUTE
    return recovery.action(call, effect)


def test_negative_control_a_plan_that_executes_unknown_side_effects_is_caught() -> None:
    """The guard above catches a plan that answers EXECUTE for an UNKNOWN
    side effect."""
    seed = secrets.randbits(32)
    print(f"seed={seed}")
    assert execute_violations(_executes_unknown_side_effects, seed) != []


# --- the guard: a delivered result is never handed out to append again -----

_APPENDS = frozenset({A.REPLAY_RESULT, A.ERROR_RESULT})


def append_violations(act: Action, seed: int, walks: int = 400) -> list[str]:
    """Acknowledged calls of random histories that `act` hands out to append
    to the transcript again."""
    rng = random.Random(seed)  # noqa: S311 (reproducible walks, not secrets)
    found = []
    for _ in range(walks):
        call, _ = random_history(rng)
        if call.acknowledged and act(call, call.effect) in _APPENDS:
            found.append(f"{[t.event.value for t in call.history]}")
    return found


def test_recovery_never_hands_out_a_delivered_result_again() -> None:
    """Over random histories, a result acknowledged as delivered is never
    REPLAY_RESULT or ERROR_RESULT again (ADR-010 D1) (issue 10 item 14: fails
    before the fix: an acknowledged result was REPLAY_RESULT)."""
    seed = secrets.randbits(32)
    print(f"seed={seed}")
    assert append_violations(recovery.action, seed) == []


def _ignores_acknowledgement(call: ToolCall, effect: Effect) -> RecoveryAction:
    """Broken on purpose: the plan of before, blind to `acknowledged`."""
    if call.state is State.COMMITTED:
        return A.ERROR_RESULT if call.rejected else A.REPLAY_RESULT
    return recovery.action(call, effect)


def test_negative_control_a_plan_blind_to_acknowledgement_is_caught() -> None:
    """The guard above catches a plan that replays acknowledged results."""
    seed = secrets.randbits(32)
    print(f"seed={seed}")
    assert append_violations(_ignores_acknowledgement, seed) != []


def test_the_walks_reach_every_state() -> None:
    """The random histories reach every state, so the guard is not vacuous."""
    seed = secrets.randbits(32)
    print(f"seed={seed}")
    rng = random.Random(seed)  # noqa: S311
    states = {random_history(rng)[0].state for _ in range(400)}
    assert states == set(State)
