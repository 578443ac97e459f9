"""The ledger rules of contract §4 and §5: what each request does to a record.

The rules are pure functions of (record, request, moment), so every case is a
record reached through the rules themselves and one call; time and daemon
incarnations are moved by hand. A property test drives random sequences of
requests and clock events and checks the at-most-once promise of ADR-010 D1/D3
for side effects; its negative control feeds the same checker a broken rule.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable, Sequence
from types import MappingProxyType

import hypothesis
import pytest
from hypothesis import strategies as st

from sidecar.errors import (
    AttemptsExhausted,
    EffectdError,
    InputMismatch,
    InvalidTransition,
    ReconciliationRequired,
    ResultMismatch,
    RetryDisabled,
    RevisionConflict,
    StaleAttempt,
)
from sidecar.ledger import rules
from sidecar.ledger.model import (
    APPROVAL_REJECTED,
    Decision,
    Effect,
    Event,
    Lease,
    Result,
    State,
    ToolCall,
)
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Answer, Now, PrepareSpec, Step
from tests.ledger.builders import (
    INCARNATION,
    LEASE_MS,
    LEASE_NS,
    MAX_ATTEMPTS,
    OTHER_INPUT,
    REF,
    TOOL,
    answer,
    awaiting,
    committed,
    error_result,
    later,
    moment,
    ok_result,
    prepared,
    refusal,
    rejected,
    spec,
    started,
    unknown,
)

EFFECTS = list(Effect)
RETRYABLE = [Effect.READ, Effect.IDEMPOTENT_WRITE]
SE = Effect.SIDE_EFFECT


def _start(
    call: ToolCall,
    now: Now,
    *,
    retry: bool = False,
    expected_revision: int | None = None,
) -> Step:
    return rules.start(
        call,
        now,
        lease_ms=LEASE_MS,
        retry=retry,
        policy=Policy(max_attempts=MAX_ATTEMPTS),
        expected_revision=expected_revision,
    )


def _commit(call: ToolCall, attempt: int, result: Result | None = None) -> Step:
    return rules.commit(
        call,
        moment(),
        attempt=attempt,
        result=result or ok_result(),
        expected_revision=None,
    )


# --- decide (contract §5.1) ------------------------------------------------------

P, A, ST, U, C = (
    State.PREPARED,
    State.AWAITING_APPROVAL,
    State.STARTED,
    State.UNKNOWN,
    State.COMMITTED,
)
R, W = Effect.READ, Effect.IDEMPOTENT_WRITE

# What contract §5.1 answers for a settled record, per (state, effect).
DECISIONS: dict[tuple[State, Effect], Decision] = {
    (P, R): Decision.EXECUTE,  # contract §5.1 EXECUTE: start it
    (P, W): Decision.EXECUTE,  # contract §5.1 EXECUTE (with idempotency_key)
    (P, SE): Decision.EXECUTE,  # contract §5.1 EXECUTE; ADR-010 D3 never started
    (A, R): Decision.AWAIT_APPROVAL,  # contract §5.1; ADR-010 D3 only approve executes
    (A, W): Decision.AWAIT_APPROVAL,  # contract §5.1
    (A, SE): Decision.AWAIT_APPROVAL,  # contract §5.1
    (ST, R): Decision.IN_PROGRESS,  # contract §5.1: another attempt holds a live lease
    (ST, W): Decision.IN_PROGRESS,  # contract §5.1
    (ST, SE): Decision.IN_PROGRESS,  # contract §5.1
    (U, R): Decision.EXECUTE,  # contract §5.1 explicit retry only
    (U, W): Decision.EXECUTE,  # contract §5.1 explicit retry only
    (U, SE): Decision.RECONCILE,  # contract §5.1 RECONCILE; ADR-010 D1, D3
    (C, R): Decision.RETURN_RESULT,  # contract §5.1; ADR-010 D3 do NOT call the tool
    (C, W): Decision.RETURN_RESULT,  # contract §5.1
    (C, SE): Decision.RETURN_RESULT,  # contract §5.1; ADR-010 D1
}

BUILD: dict[State, Callable[[Effect], ToolCall]] = {
    State.PREPARED: prepared,
    State.AWAITING_APPROVAL: awaiting,
    State.STARTED: started,
    State.UNKNOWN: unknown,
    State.COMMITTED: committed,
}


@pytest.mark.parametrize(
    ("state", "effect"),
    list(itertools.product(State, Effect)),
    ids=lambda v: v.name,
)
def test_decide_answers_the_design_decision_for_every_state_and_effect(
    state: State, effect: Effect
) -> None:
    """`decide` gives the contract §5.1 decision for every (state, effect)."""
    call = BUILD[state](effect)
    assert call.state is state
    assert rules.decide(call) is DECISIONS[(state, effect)]


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize(
    ("build", "want"),
    [
        # contract §4.5 reject -> COMMITTED ERROR APPROVAL_REJECTED; §5.1 REJECTED.
        pytest.param(rejected, Decision.REJECTED, id="rejected"),
        # contract §5.1 RETURN_RESULT: a committed OK or tool ERROR is replayed.
        pytest.param(committed, Decision.RETURN_RESULT, id="ok"),
        pytest.param(
            lambda e: committed(e, error_result("TIMEOUT")),
            Decision.RETURN_RESULT,
            id="tool-error",
        ),
    ],
)
def test_decide_tells_a_rejection_from_a_committed_result(
    effect: Effect, build: Callable[[Effect], ToolCall], want: Decision
) -> None:
    """A COMMITTED record answers REJECTED only when an approver rejected it."""
    assert rules.decide(build(effect)) is want


# --- prepare (contract §4.2 prepare, §5) ---------------------------------------


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_new_prepare_records_a_prepared_call_and_invites_execution(
    effect: Effect,
) -> None:
    """The first prepare stores a PREPARED record at revision 1 and answers EXECUTE
    without handing out an attempt."""
    # contract §4.2: — prepare -> PREPARED; §5.2 EXECUTE from a plain prepare.
    step = rules.prepare(None, spec(effect), moment())
    reply = answer(step)
    assert step.call.state is State.PREPARED
    assert step.call.revision == 1
    assert step.call.attempt == 0
    assert step.call.lease is None
    assert step.call.ref == REF
    assert [t.event for t in step.call.history] == [Event.PREPARE]
    assert (reply.decision, reply.attempt_held, reply.retry_required) == (
        Decision.EXECUTE,
        False,
        False,
    )
    assert reply.call == step.call


@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_prepare_that_requires_approval_waits_for_it(
    effect: Effect, start: bool
) -> None:
    """With approval required the call is AWAITING_APPROVAL and is not started,
    even when the prepare asks to start."""
    # contract §4.2: prepare -> AWAITING_APPROVAL if approval required; ADR-010 D3.
    step = rules.prepare(
        None, spec(effect, require_approval=True, start=start), moment()
    )
    reply = answer(step)
    assert step.call.state is State.AWAITING_APPROVAL
    assert step.call.approval_required
    assert step.call.attempt == 0
    assert reply.decision is Decision.AWAIT_APPROVAL
    assert not reply.attempt_held


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_prepare_with_start_holds_attempt_one_under_a_lease(effect: Effect) -> None:
    """Prepare-and-start answers EXECUTE with the attempt held: attempt 1, STARTED,
    and a lease of this incarnation ending lease_ms later."""
    # contract §5.2 "Prepare and start can happen in one round trip"; §4.2 start.
    now = moment()
    step = rules.prepare(None, spec(effect, start=True), now)
    reply = answer(step)
    assert reply.decision is Decision.EXECUTE
    assert reply.attempt_held
    assert not reply.retry_required
    assert step.call.state is State.STARTED
    assert step.call.attempt == 1
    assert step.call.revision == 2
    assert step.call.lease == Lease(
        INCARNATION, now.monotonic_ns + LEASE_NS, now.wall_ns + LEASE_NS
    )
    assert [t.event for t in step.call.history] == [Event.PREPARE, Event.START]


@pytest.mark.parametrize(
    ("effect", "key"),
    [
        (Effect.READ, ""),  # contract §5.1: key only for IDEMPOTENT_WRITE
        (Effect.IDEMPOTENT_WRITE, "run-1:call-1"),  # contract §3.2; ADR-010 D2
        (Effect.SIDE_EFFECT, ""),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_the_idempotency_key_is_given_for_idempotent_writes_only(
    effect: Effect, key: str
) -> None:
    """EXECUTE carries `${runId}:${callId}` exactly when the tool is an
    idempotent write."""
    reply = answer(rules.prepare(None, spec(effect, start=True), moment()))
    assert reply.idempotency_key == key
    assert reply.call.idempotency_key == "run-1:call-1"


def _states_to_repeat() -> list[object]:
    rows: list[object] = []
    for effect in Effect:
        for name, build in [
            ("prepared", prepared),
            ("awaiting", awaiting),
            ("started", started),
            ("unknown", unknown),
            ("committed", committed),
            ("rejected", rejected),
        ]:
            rows.append(pytest.param(build, effect, id=f"{name}-{effect.name}"))
    return rows


@pytest.mark.parametrize(("build", "effect"), _states_to_repeat())
def test_a_repeated_prepare_with_the_same_input_changes_nothing(
    build: Callable[[Effect], ToolCall], effect: Effect
) -> None:
    """A second prepare with the same fingerprint returns the stored record,
    at the same revision, with the decision for its state."""
    # contract §4.2 "any | prepare again, same fingerprint | unchanged".
    existing = build(effect)
    step = rules.prepare(existing, spec(effect), moment())
    reply = answer(step)
    assert step.call == existing
    assert reply.call == existing
    assert reply.decision is rules.decide(existing)
    assert not reply.attempt_held


@pytest.mark.parametrize(
    "mismatch",
    [
        pytest.param(lambda e: spec(e, payload=OTHER_INPUT), id="fingerprint"),
        pytest.param(lambda e: spec(e, tool_name="other_tool"), id="tool"),
        pytest.param(
            lambda e: spec(Effect.READ if e is not Effect.READ else SE), id="effect"
        ),
        pytest.param(lambda e: spec(e, payload=OTHER_INPUT, start=True), id="start"),
    ],
)
@pytest.mark.parametrize(("build", "effect"), _states_to_repeat())
def test_a_repeated_prepare_of_another_call_is_refused_unchanged(
    build: Callable[[Effect], ToolCall],
    effect: Effect,
    mismatch: Callable[[Effect], PrepareSpec],
) -> None:
    """Another fingerprint, tool name or effect is INPUT_MISMATCH, and the stored
    record is returned exactly as it was."""
    # contract §3.3 "A repeated prepare with another fingerprint ... is refused".
    existing = build(effect)
    # Even with the lease long gone: a refused request does not settle.
    step = rules.prepare(existing, mismatch(effect), later(moment(), 10 * LEASE_NS))
    error = refusal(step, InputMismatch)
    assert step.call is existing
    assert error.metadata["callRevision"] == str(existing.revision)


@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_prepare_while_a_live_lease_is_held_is_in_progress(
    effect: Effect, start: bool
) -> None:
    """While attempt 1 holds a live lease a prepare (with or without start)
    answers IN_PROGRESS and hands out nothing."""
    # contract §5.1 IN_PROGRESS: another attempt holds a live lease.
    now = moment()
    call = started(effect, now)
    just_before = later(now, LEASE_NS - 1)
    step = rules.prepare(call, spec(effect, start=start), just_before)
    reply = answer(step)
    assert step.call == call
    assert reply.decision is Decision.IN_PROGRESS
    assert not reply.attempt_held


# The expected answer once a STARTED call is found UNKNOWN (contract §5.1).
AFTER_UNKNOWN = {
    Effect.SIDE_EFFECT: (Decision.RECONCILE, False),  # ADR-010 D3: reconcile
    Effect.READ: (Decision.EXECUTE, True),  # contract §5.1: an explicit retry only
    Effect.IDEMPOTENT_WRITE: (Decision.EXECUTE, True),  # ADR-010 D3 last bullet
}


def check_found_unknown(step: Step, effect: Effect, *, start: bool) -> None:
    """The reply of a prepare that found the call UNKNOWN: RECONCILE for a side
    effect; otherwise a retry-only EXECUTE, or with `start` (which must hold
    what it answers EXECUTE to) the refusal that asks for an explicit retry."""
    if start and effect is not SE:
        refused = refusal(step, InvalidTransition)
        assert refused.metadata["retryRequired"] == "true"
        return
    reply = answer(step)
    assert (reply.decision, reply.retry_required) == AFTER_UNKNOWN[effect]
    assert not reply.attempt_held


@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_prepare_after_the_lease_expired_finds_the_call_unknown(
    effect: Effect, start: bool
) -> None:
    """Once the lease deadline passes, prepare stores UNKNOWN via 'expire' and
    answers RECONCILE for a side effect, a retry-only EXECUTE otherwise."""
    # contract §4.2: STARTED, lease expired -> UNKNOWN; §5.1 RECONCILE; ADR-010 D3.
    now = moment()
    call = started(effect, now)
    assert call.lease is not None
    at_deadline = Now(now.wall_ns + LEASE_NS, call.lease.deadline_ns, INCARNATION)
    step = rules.prepare(call, spec(effect, start=start), at_deadline)
    check_found_unknown(step, effect, start=start)
    assert step.call.state is State.UNKNOWN
    assert step.call.revision == call.revision + 1
    assert step.call.lease is None
    assert step.call.attempt == 1
    last = step.call.history[-1]
    assert (last.event, last.from_state, last.to_state, last.actor) == (
        Event.EXPIRE,
        State.STARTED,
        State.UNKNOWN,
        rules.DAEMON,
    )


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_prepare_under_a_later_incarnation_finds_the_call_unknown(
    effect: Effect,
) -> None:
    """A lease of an earlier daemon incarnation is never live, whatever the
    monotonic clock says: prepare stores UNKNOWN via 'restart'."""
    # contract §4.4: started under an earlier daemon incarnation -> UNKNOWN; D3.
    call = started(effect)
    restarted = moment(monotonic_ns=0, incarnation=INCARNATION + 1)
    step = rules.prepare(call, spec(effect, start=True), restarted)
    check_found_unknown(step, effect, start=True)
    assert step.call.state is State.UNKNOWN
    assert step.call.history[-1].event is Event.RESTART
    assert step.call.history[-1].actor == rules.DAEMON


# --- start (contract §4.2 start / retry, §5.2) ------------------------------------


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_start_of_a_prepared_call_holds_the_first_attempt(effect: Effect) -> None:
    """StartTool on PREPARED answers EXECUTE, attempt 1 held under a new lease."""
    # contract §4.2 "PREPARED | start | STARTED (attempt + 1, lease, fencing token)".
    call = prepared(effect)
    now = later(moment(), 1000)
    step = _start(call, now, expected_revision=call.revision)
    reply = answer(step)
    assert (reply.decision, reply.attempt_held) == (Decision.EXECUTE, True)
    assert step.call.state is State.STARTED
    assert step.call.attempt == 1
    assert step.call.revision == call.revision + 1
    assert step.call.lease == Lease(
        INCARNATION, now.monotonic_ns + LEASE_NS, now.wall_ns + LEASE_NS
    )


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_second_start_is_in_progress(effect: Effect) -> None:
    """Only the first StartTool executes; the second is told IN_PROGRESS while
    the lease is live."""
    # contract §5.2 "only the StartTool that wins the revision CAS may execute (the
    # others get IN_PROGRESS)".
    first = _start(prepared(effect), moment()).call
    step = _start(first, later(moment(), 1))
    reply = answer(step)
    assert step.call == first
    assert reply.decision is Decision.IN_PROGRESS
    assert not reply.attempt_held


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_retry_while_the_lease_is_live_hands_out_nothing(effect: Effect) -> None:
    """A retry of a STARTED call whose lease is live starts no second attempt."""
    # contract §5.1 IN_PROGRESS while another attempt holds a live lease; §4.2 refuses
    # a SIDE_EFFECT retry. Which of the two a live SIDE_EFFECT answers is not
    # pinned here (contract §4.2's retry rows do not say whether the lease is live).
    first = _start(prepared(effect), moment()).call
    step = _start(first, later(moment(), 1), retry=True)
    assert step.call == first
    if isinstance(step.reply, Answer):
        assert step.reply.decision is Decision.IN_PROGRESS
        assert not step.reply.attempt_held
    else:
        assert effect is SE
        refusal(step, ReconciliationRequired)


@pytest.mark.parametrize(
    ("build", "effect"),
    [pytest.param(prepared, e, id=f"prepared-{e.name}") for e in Effect]
    + [pytest.param(unknown, e, id=f"unknown-{e.name}") for e in Effect],
)
def test_start_with_a_stale_expected_revision_is_a_conflict(
    build: Callable[[Effect], ToolCall], effect: Effect
) -> None:
    """A start that expects another revision is REVISION_CONFLICT carrying the
    current revision, and the record is left as it was."""
    # contract §4.3 "REVISION_CONFLICT, carrying the current revision".
    call = build(effect)
    step = _start(call, moment(), retry=True, expected_revision=call.revision - 1)
    error = refusal(step, RevisionConflict)
    assert error.current_revision == call.revision
    assert error.metadata["currentRevision"] == str(call.revision)
    assert step.call is call


@pytest.mark.parametrize("retry", [False, True])
def test_start_of_an_unknown_side_effect_requires_reconciliation(retry: bool) -> None:
    """An UNKNOWN side effect is never started again, retry or not."""
    # contract §4.2: STARTED / UNKNOWN, SIDE_EFFECT, retry -> RECONCILIATION_REQUIRED.
    call = unknown(SE)
    step = _start(call, moment(), retry=retry)
    refusal(step, ReconciliationRequired)
    assert step.call is call


@pytest.mark.parametrize("retry", [False, True])
def test_start_after_the_lease_expired_settles_then_refuses_a_side_effect(
    retry: bool,
) -> None:
    """A start that finds a side effect's lease expired stores UNKNOWN and still
    refuses with RECONCILIATION_REQUIRED."""
    # contract §4.4 lease expired -> UNKNOWN; rules.py: a refusal carries the change.
    call = started(SE)
    step = _start(call, later(moment(), LEASE_NS), retry=retry)
    refusal(step, ReconciliationRequired)
    assert step.call.state is State.UNKNOWN
    assert step.call.history[-1].event is Event.EXPIRE


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
def test_start_of_an_unknown_read_without_retry_is_an_invalid_transition(
    effect: Effect,
) -> None:
    """An UNKNOWN READ / IDEMPOTENT_WRITE starts again only as an explicit retry."""
    # contract §4.2 "explicit retry allowed by the retry rules"; ADR-010 D3, D7.
    call = unknown(effect)
    step = _start(call, moment(), retry=False)
    refusal(step, InvalidTransition)
    assert step.call is call


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
def test_an_explicit_retry_of_an_unknown_read_is_the_next_attempt(
    effect: Effect,
) -> None:
    """An explicit retry answers EXECUTE for attempt 2 under a new lease, with the
    same idempotency key as attempt 1."""
    # contract §4.2 "STARTED / UNKNOWN, READ or IDEMPOTENT_WRITE | retry | STARTED
    # (attempt+1)"; ADR-010 D2: the key is stable across retries.
    first = answer(rules.prepare(None, spec(effect, start=True), moment()))
    call = rules.report_unknown(first.call, moment(), attempt=1, reason="lost").call
    now = later(moment(), 2000)
    step = _start(call, now, retry=True, expected_revision=call.revision)
    reply = answer(step)
    assert (reply.decision, reply.attempt_held) == (Decision.EXECUTE, True)
    assert step.call.state is State.STARTED
    assert step.call.attempt == 2
    assert step.call.history[-1].event is Event.RETRY
    assert step.call.lease is not None
    assert step.call.lease.deadline_ns == now.monotonic_ns + LEASE_NS
    assert reply.idempotency_key == first.idempotency_key
    assert step.call.idempotency_key == first.call.idempotency_key


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
def test_a_retry_beyond_the_attempt_budget_is_refused(effect: Effect) -> None:
    """When every allowed attempt was used, a retry is ATTEMPTS_EXHAUSTED and the
    record is left UNKNOWN."""
    # contract §7.2 "The attempt budget always applies"; ADR-010 D7.
    call = unknown(effect)
    for attempt in range(2, MAX_ATTEMPTS + 1):
        call = answer(_start(call, moment(), retry=True)).call
        assert call.attempt == attempt
        call = rules.report_unknown(call, moment(), attempt=attempt, reason="").call
    step = _start(call, moment(), retry=True)
    error = refusal(step, AttemptsExhausted)
    assert error.metadata == {
        "attempts": str(MAX_ATTEMPTS),
        "maxAttempts": str(MAX_ATTEMPTS),
    }
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(awaiting, id="awaiting"),
        pytest.param(committed, id="committed"),
        pytest.param(rejected, id="rejected"),
    ],
)
def test_start_never_executes_a_call_waiting_for_approval_or_committed(
    build: Callable[[Effect], ToolCall], effect: Effect
) -> None:
    """StartTool on AWAITING_APPROVAL or COMMITTED hands out no attempt and does
    not change the record."""
    # ADR-010 D3: only approve executes; committed -> do NOT call the tool.
    call = build(effect)
    step = _start(call, moment(), retry=True)
    assert step.call == call
    if isinstance(step.reply, Answer):
        assert step.reply.decision is not Decision.EXECUTE
        assert not step.reply.attempt_held


# --- commit (contract §4.2 commit) ----------------------------------------------


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_commit_of_the_holding_attempt_stores_the_result(effect: Effect) -> None:
    """The attempt holding the call commits it: COMMITTED, result stored, lease
    released, RETURN_RESULT."""
    # contract §4.2 "STARTED | commit OK / ERROR | COMMITTED".
    call = started(effect)
    result = ok_result()
    step = rules.commit(
        call, moment(), attempt=1, result=result, expected_revision=call.revision
    )
    reply = answer(step)
    assert step.call.state is State.COMMITTED
    assert step.call.result == result
    assert step.call.lease is None
    assert step.call.revision == call.revision + 1
    assert reply.decision is Decision.RETURN_RESULT


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize("attempt", [0, 2, -1])
def test_commit_from_an_attempt_that_does_not_hold_the_call_is_stale(
    effect: Effect, attempt: int
) -> None:
    """A commit with another fencing token than the current attempt is
    STALE_ATTEMPT and stores nothing."""
    # contract §4.3 "an attempt that no longer holds the call is refused".
    call = started(effect)
    step = _commit(call, attempt)
    refusal(step, StaleAttempt)
    assert step.call is call


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
def test_commit_from_the_attempt_before_a_retry_is_stale(effect: Effect) -> None:
    """After a retry started attempt 2, attempt 1 can no longer commit."""
    # contract §4.3 fencing token; ADR-010 D1 nothing silently overwritten.
    call = answer(_start(unknown(effect), moment(), retry=True)).call
    step = _commit(call, 1)
    error = refusal(step, StaleAttempt)
    assert error.metadata["currentAttempt"] == "2"
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize("attempt", [1, 5])
def test_a_repeated_commit_with_the_same_result_is_a_no_op(
    effect: Effect, attempt: int
) -> None:
    """Committing the same result digest again changes nothing and returns it."""
    # contract §4.2 "a repeat with the same result digest is a no-op".
    call = committed(effect)
    step = _commit(call, attempt)
    reply = answer(step)
    assert step.call is call
    assert reply.decision is Decision.RETURN_RESULT


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_repeated_commit_with_another_result_is_refused(effect: Effect) -> None:
    """Committing another result over a committed one is RESULT_MISMATCH; the
    first result stands."""
    # contract §4.2 "a different one is refused"; ADR-010 D1.
    call = committed(effect)
    step = _commit(call, 1, result=ok_result(b'{"id": 2}'))
    error = refusal(step, ResultMismatch)
    assert call.result is not None
    assert error.metadata["committedDigest"] == call.result.digest
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "build",
    [pytest.param(prepared, id="prepared"), pytest.param(awaiting, id="awaiting")],
)
def test_commit_before_start_is_an_invalid_transition(
    build: Callable[[Effect], ToolCall], effect: Effect
) -> None:
    """A call that was never started cannot be committed."""
    # contract §4.2: no commit before a start (the agent executes after start).
    call = build(effect)
    step = _commit(call, 0)
    refusal(step, InvalidTransition)
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_commit_with_a_stale_expected_revision_is_a_conflict(effect: Effect) -> None:
    """A commit expecting another revision is REVISION_CONFLICT and stores nothing."""
    # contract §4.3 expected_revision.
    call = started(effect)
    step = rules.commit(
        call, moment(), attempt=1, result=ok_result(), expected_revision=1
    )
    error = refusal(step, RevisionConflict)
    assert error.current_revision == call.revision
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize("how", ["report", "expire", "restart"])
def test_a_late_commit_of_the_current_attempt_in_unknown_commits(
    effect: Effect, how: str
) -> None:
    """The attempt that still holds the fencing token may commit an UNKNOWN call."""
    # machine.py: the holder knows the outcome, better evidence than reconciling.
    call = started(effect)
    if how == "report":
        call = rules.report_unknown(call, moment(), attempt=1, reason="").call
    else:
        gone = (
            later(moment(), LEASE_NS)
            if how == "expire"
            else moment(incarnation=INCARNATION + 1)
        )
        call = rules.prepare(call, spec(effect), gone).call
    assert call.state is State.UNKNOWN
    step = _commit(call, 1)
    answer(step)
    assert step.call.state is State.COMMITTED
    assert step.call.history[-1].from_state is State.UNKNOWN


# --- report_unknown and heartbeat (contract §4.2) -------------------------------


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_report_unknown_moves_the_call_to_unknown(effect: Effect) -> None:
    """The holding attempt's report stores UNKNOWN with its reason and answers as
    for any UNKNOWN call."""
    # contract §4.2: the agent reports an unknown outcome -> UNKNOWN; §5.1.
    call = started(effect)
    step = rules.report_unknown(call, moment(), attempt=1, reason="socket closed")
    reply = answer(step)
    assert step.call.state is State.UNKNOWN
    assert step.call.lease is None
    assert step.call.revision == call.revision + 1
    last = step.call.history[-1]
    assert (last.event, last.reason, last.actor) == (
        Event.REPORT_UNKNOWN,
        "socket closed",
        rules.AGENT,
    )
    assert (reply.decision, reply.retry_required) == AFTER_UNKNOWN[effect]
    assert not reply.attempt_held


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_repeated_report_unknown_is_a_no_op(effect: Effect) -> None:
    """The same attempt reporting unknown twice changes nothing the second time."""
    # contract §4.3: every mutation is revision-guarded; a duplicate is not a new fact.
    call = unknown(effect)
    step = rules.report_unknown(call, moment(), attempt=1, reason="again")
    assert step.call is call
    assert answer(step).decision is AFTER_UNKNOWN[effect][0]


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_report_unknown_from_a_stale_attempt_is_refused(effect: Effect) -> None:
    """Only the attempt that holds the call can say its outcome is unknown."""
    # contract §4.3 fencing token.
    call = started(effect)
    step = rules.report_unknown(call, moment(), attempt=2, reason="")
    refusal(step, StaleAttempt)
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(prepared, id="prepared"),
        pytest.param(awaiting, id="awaiting"),
        pytest.param(committed, id="committed"),
    ],
)
def test_report_unknown_outside_started_is_an_invalid_transition(
    build: Callable[[Effect], ToolCall], effect: Effect
) -> None:
    """A call that is not running has no outcome to be unknown."""
    # contract §4.2: only STARTED -> UNKNOWN.
    call = build(effect)
    step = rules.report_unknown(call, moment(), attempt=1, reason="")
    refusal(step, InvalidTransition)
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_heartbeat_extends_the_lease_without_a_history_entry(effect: Effect) -> None:
    """A heartbeat of the holding attempt moves the lease deadline to now +
    lease_ms, bumps the revision and adds no history."""
    # contract §4.4: lease of the attempt; §4.3 revision on every change.
    call = started(effect)
    now = later(moment(), LEASE_NS - 1)
    step = rules.heartbeat(call, now, attempt=1, lease_ms=2 * LEASE_MS)
    answer(step)
    assert step.call.state is State.STARTED
    assert step.call.lease == Lease(
        INCARNATION, now.monotonic_ns + 2 * LEASE_NS, now.wall_ns + 2 * LEASE_NS
    )
    assert step.call.revision == call.revision + 1
    assert step.call.history == call.history
    # The extended lease is live past the old deadline.
    after = rules.prepare(step.call, spec(effect), later(moment(), LEASE_NS + 1))
    assert answer(after).decision is Decision.IN_PROGRESS


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize("attempt", [0, 2])
def test_heartbeat_from_a_stale_attempt_is_refused(
    effect: Effect, attempt: int
) -> None:
    """A heartbeat with another fencing token extends nothing."""
    # contract §4.3 fencing token.
    call = started(effect)
    step = rules.heartbeat(call, moment(), attempt=attempt, lease_ms=LEASE_MS)
    refusal(step, StaleAttempt)
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_heartbeat_in_unknown_is_an_invalid_transition(effect: Effect) -> None:
    """An UNKNOWN call has no lease to extend; a heartbeat cannot revive it."""
    # contract §4.2: only reconciliation (or an explicit retry) leaves UNKNOWN.
    call = unknown(effect)
    step = rules.heartbeat(call, moment(), attempt=1, lease_ms=LEASE_MS)
    refusal(step, InvalidTransition)
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize(
    ("gone", "event"),
    [
        # contract §4.4 "lease expired" -> UNKNOWN.
        pytest.param(later(moment(), LEASE_NS), Event.EXPIRE, id="expired"),
        # contract §4.4 "started under an earlier daemon incarnation" -> UNKNOWN.
        pytest.param(moment(incarnation=INCARNATION + 1), Event.RESTART, id="restart"),
    ],
)
def test_a_heartbeat_after_the_lease_is_gone_stores_unknown_and_refuses(
    effect: Effect, gone: Now, event: Event
) -> None:
    """A heartbeat that arrives after the lease is gone finds the call UNKNOWN
    (stored) and cannot revive it."""
    call = started(effect)
    step = rules.heartbeat(call, gone, attempt=1, lease_ms=LEASE_MS)
    refusal(step, InvalidTransition)
    assert step.call.state is State.UNKNOWN
    assert step.call.history[-1].event is event


# --- property: a started side effect is never executed again (ADR-010 D1, D3) --


class Op(enum.Enum):
    PREPARE = "prepare"  # flag: start in the same round trip
    PREPARE_START = "prepare_start"  # start in the same round trip; flag: retry
    START = "start"  # flag: retry
    COMMIT = "commit"  # flag: from a stale attempt
    REPORT_UNKNOWN = "report_unknown"  # flag: from a stale attempt
    HEARTBEAT = "heartbeat"  # flag: from a stale attempt
    EXPIRE = "expire"  # the clock passes every lease granted so far
    RESTART = "restart"  # a new incarnation; flag: its monotonic clock restarts at 0
    TICK = "tick"  # a little time passes


@dataclasses.dataclass(frozen=True, slots=True)
class Action:
    op: Op
    flag: bool


PrepareRule = Callable[[ToolCall | None, PrepareSpec, Now], Step]


def side_effect_violation(effect: Effect, ever_started: bool, step: Step) -> str:
    """Why `step` breaks at-most-once for a side effect, or "" if it does not.

    A SIDE_EFFECT that was STARTED before the request may have run: no reply may
    then hand out an attempt or invite execution (ADR-010 D1, D3; contract §4.2, §5.2).
    """
    reply = step.reply
    if effect is not SE or not ever_started or not isinstance(reply, Answer):
        return ""
    if reply.attempt_held:
        return (
            f"side effect: attempt {reply.call.attempt} held in {reply.call.state.name}"
        )
    if reply.decision is Decision.EXECUTE:
        retry = " (retry_required)" if reply.retry_required else ""
        return f"side effect: EXECUTE{retry} in {reply.call.state.name}"
    return ""


def start_violation(asked: PrepareSpec, before: ToolCall | None, step: Step) -> str:
    """Why a prepare `step` breaks contract §5.2's start promise, or "" if it does
    not: with `start`, EXECUTE means that this caller holds a new attempt."""
    reply = step.reply
    if not asked.start or not isinstance(reply, Answer):
        return ""
    if reply.decision is Decision.EXECUTE and not reply.attempt_held:
        state = "none" if before is None else before.state.name
        return f"start: EXECUTE without the attempt (found {state})"
    return ""


def fencing_violation(before: ToolCall | None, step: Step) -> str:
    """Why `step` breaks the fencing of attempts, or "" if it does not.

    Each attempt number is handed to one caller only, and revisions only grow
    (contract §4.3 fencing token, revision).
    """
    if before is not None and step.call.revision < before.revision:
        return f"fencing: revision {before.revision} -> {step.call.revision}"
    if not isinstance(step.reply, Answer) or not step.reply.attempt_held:
        return ""
    previous = 0 if before is None else before.attempt
    if step.call.state is not State.STARTED or step.call.attempt != previous + 1:
        return f"fencing: attempt {step.call.attempt} held in {step.call.state.name}"
    return ""


def _advance(now: Now, action: Action) -> Now:
    """The clock after `action`: a millisecond per request, more for clock events."""
    now = Now(now.wall_ns + 1_000_000, now.monotonic_ns, now.incarnation)
    match action.op:
        case Op.EXPIRE:
            return later(now, LEASE_NS)
        case Op.TICK:
            return later(now, LEASE_NS // 3)
        case Op.RESTART:
            mono = 0 if action.flag else now.monotonic_ns
            return Now(now.wall_ns, mono, now.incarnation + 1)
    return now


def _request(call: ToolCall, now: Now, action: Action) -> Step | None:
    """The rule `action` asks for on an existing record (None for clock events)."""
    attempt = call.attempt - action.flag
    match action.op:
        case Op.START:
            return rules.start(
                call,
                now,
                lease_ms=LEASE_MS,
                retry=action.flag,
                policy=Policy(max_attempts=MAX_ATTEMPTS),
                expected_revision=None,
            )
        case Op.COMMIT:
            return rules.commit(
                call, now, attempt=attempt, result=ok_result(), expected_revision=None
            )
        case Op.REPORT_UNKNOWN:
            return rules.report_unknown(call, now, attempt=attempt, reason="")
        case Op.HEARTBEAT:
            return rules.heartbeat(call, now, attempt=attempt, lease_ms=LEASE_MS)
    return None


def run(
    effect: Effect, actions: Sequence[Action], prepare: PrepareRule = rules.prepare
) -> list[str]:
    """Plays `actions` against the rules and returns every violation found."""
    call: ToolCall | None = None
    now = moment()
    ever_started = False
    violations: list[str] = []
    for index, action in enumerate(actions):
        now = _advance(now, action)
        step: Step | None = None
        asked: PrepareSpec | None = None
        if action.op is Op.PREPARE:
            asked = spec(effect, start=action.flag)
        elif action.op is Op.PREPARE_START:
            asked = dataclasses.replace(spec(effect, start=True), retry=action.flag)
        if asked is not None:
            step = prepare(call, asked, now)
        elif call is not None:
            step = _request(call, now, action)
        if step is None:
            continue
        for why in (
            side_effect_violation(effect, ever_started, step),
            fencing_violation(call, step),
            "" if asked is None else start_violation(asked, call, step),
        ):
            if why:
                violations.append(f"step {index} {action.op.value}: {why}")
        call = step.call
        ever_started = ever_started or call.state is State.STARTED
    return violations


ACTIONS = st.builds(Action, st.sampled_from(Op), st.booleans())
# Every script begins with a prepare, so no draw is wasted on a missing record.
SCRIPTS = st.builds(
    lambda first, rest: [first, *rest],
    st.builds(Action, st.just(Op.PREPARE), st.booleans()),
    st.lists(ACTIONS, min_size=2, max_size=24),
)
PROPERTY = hypothesis.settings(
    max_examples=250,
    deadline=None,
    database=None,  # write nothing outside the test tree
    print_blob=True,  # a failure prints the @reproduce_failure blob
)


@PROPERTY
@hypothesis.given(effect=st.sampled_from(Effect), script=SCRIPTS)
def test_no_sequence_executes_a_started_side_effect_again(
    effect: Effect, script: list[Action]
) -> None:
    """No sequence of requests, expiries and restarts hands out an attempt or an
    EXECUTE for a SIDE_EFFECT that was ever STARTED, or answers a prepare with
    `start` EXECUTE without a new attempt held (issue 10 item 9: fails before
    the fix, for READ and IDEMPOTENT_WRITE)."""
    # ADR-010 D1 "never replayed automatically", D3; contract §4.2
    # RECONCILIATION_REQUIRED.
    hypothesis.note(
        f"effect={effect.name} script={[(a.op.value, a.flag) for a in script]}"
    )
    assert run(effect, script) == []


def _broken(answer_for_unknown: Callable[[ToolCall], Answer]) -> PrepareRule:
    """rules.prepare with the bug the property guards against: an UNKNOWN side
    effect gets `answer_for_unknown` instead of RECONCILE, as if it never ran."""

    def prepare(existing: ToolCall | None, spec: PrepareSpec, now: Now) -> Step:
        step = rules.prepare(existing, spec, now)
        if step.call.state is State.UNKNOWN:
            return Step(step.call, answer_for_unknown(step.call))
        return step

    return prepare


BROKEN: dict[str, PrepareRule] = {
    "execute": _broken(lambda c: Answer(Decision.EXECUTE, c)),
    "execute-retry": _broken(
        lambda c: Answer(Decision.EXECUTE, c, retry_required=True)
    ),
    "held": _broken(lambda c: Answer(Decision.EXECUTE, c, attempt_held=True)),
}

NEGATIVE_SCRIPTS = {
    "expire": [
        Action(Op.PREPARE, True),  # started, attempt 1
        Action(Op.EXPIRE, False),  # the lease runs out
        Action(Op.PREPARE, False),  # found UNKNOWN: must be RECONCILE
    ],
    "restart": [
        Action(Op.PREPARE, True),
        Action(Op.RESTART, True),  # a new incarnation; monotonic clock back at 0
        Action(Op.PREPARE, True),
    ],
}


@pytest.mark.parametrize("script", NEGATIVE_SCRIPTS)
@pytest.mark.parametrize("variant", BROKEN)
def test_negative_control_the_checker_catches_a_broken_prepare(
    variant: str, script: str
) -> None:
    """The property's side-effect checker reports the prepare that answers EXECUTE
    for an UNKNOWN side effect, and nothing for the real rule on the same script."""
    actions = NEGATIVE_SCRIPTS[script]
    assert run(SE, actions) == []
    found = run(SE, actions, BROKEN[variant])
    assert "step 2 prepare: side effect: " in "\n".join(found), found


@pytest.mark.parametrize("variant", BROKEN)
def test_negative_control_the_random_search_finds_the_broken_prepare(
    variant: str,
) -> None:
    """Random scripts, drawn as the property draws them, find each broken prepare."""
    found = hypothesis.find(
        SCRIPTS,
        lambda script: bool(run(SE, script, BROKEN[variant])),
        settings=hypothesis.settings(
            max_examples=300,
            database=None,
            deadline=None,
            # The first hit is proof enough; shrinking it would only cost time.
            phases=[hypothesis.Phase.generate],
        ),
    )
    assert run(SE, found, BROKEN[variant])
    assert not run(SE, found)


def _unheld_execute(existing: ToolCall | None, spec: PrepareSpec, now: Now) -> Step:
    """BROKEN on purpose, as prepare was: with `start`, a READ or
    IDEMPOTENT_WRITE found UNKNOWN gets EXECUTE (retry_required), not held."""
    step = rules.prepare(existing, spec, now)
    if spec.start and step.call.state is State.UNKNOWN and step.call.effect is not SE:
        return Step(step.call, Answer(Decision.EXECUTE, step.call, retry_required=True))
    return step


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
def test_negative_control_the_checker_catches_an_unheld_execute(
    effect: Effect,
) -> None:
    """The property's start checker reports the prepare that answers EXECUTE
    without the attempt, and nothing for the real rule on the same script."""
    script = [
        Action(Op.PREPARE, True),  # started, attempt 1
        Action(Op.EXPIRE, False),  # the lease runs out
        Action(Op.PREPARE, True),  # found UNKNOWN; with start
    ]
    assert run(effect, script) == []
    found = run(effect, script, _unheld_execute)
    assert found == [
        "step 2 prepare: start: EXECUTE without the attempt (found STARTED)"
    ]


def test_negative_control_the_random_search_finds_the_unheld_execute() -> None:
    """Random scripts, drawn as the property draws them, find it too."""
    found = hypothesis.find(
        SCRIPTS,
        lambda script: bool(run(Effect.READ, script, _unheld_execute)),
        settings=hypothesis.settings(
            max_examples=300,
            database=None,
            deadline=None,
            phases=[hypothesis.Phase.generate],
        ),
    )
    assert not run(Effect.READ, found)


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
def test_prepare_and_start_of_an_unknown_read_does_not_retry_it(
    effect: Effect,
) -> None:
    """Prepare-and-start of an UNKNOWN READ / IDEMPOTENT_WRITE without `retry`
    hands out no attempt and answers no EXECUTE: it is refused, asking for an
    explicit retry, and the record is unchanged (issue 10 item 9: fails before
    the fix: it answered EXECUTE without holding the attempt)."""
    # contract §4.2 "explicit retry ... never triggered by recovery itself"; D3;
    # contract §5.2 "EXECUTE always means that this caller holds the attempt".
    call = unknown(effect)
    step = rules.prepare(call, spec(effect, start=True), moment())
    refused = refusal(step, InvalidTransition)
    assert refused.metadata == {
        "state": "UNKNOWN",
        "event": "start",
        "attempt": "1",
        "retryRequired": "true",
    }
    assert step.call is call


def _prepare_retry(
    call: ToolCall, now: Now, policy: Policy, *, effect: Effect | None = None
) -> Step:
    asked = dataclasses.replace(spec(effect or call.effect, start=True), retry=True)
    return rules.prepare(call, asked, now, policy)


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
def test_prepare_and_start_with_retry_holds_the_next_attempt(effect: Effect) -> None:
    """With `retry`, prepare-and-start retries an UNKNOWN READ / IDEMPOTENT_WRITE
    in the same transaction: EXECUTE holds attempt 2 (event retry), and attempt
    1's late commit is then STALE_ATTEMPT (issue 10 item 9: fails before the
    fix: no attempt was held)."""
    call = unknown(effect)
    step = _prepare_retry(call, moment(), Policy(max_attempts=MAX_ATTEMPTS))
    reply = answer(step)
    assert (reply.decision, reply.attempt_held) == (Decision.EXECUTE, True)
    assert (step.call.state, step.call.attempt) == (State.STARTED, 2)
    assert step.call.history[-1].event is Event.RETRY
    refusal(_commit(step.call, 1), StaleAttempt)
    assert answer(_commit(step.call, 2)).call.state is State.COMMITTED


RETRY_REFUSALS: list[tuple[str, Policy, type[EffectdError]]] = [
    # ADR-010 R2: the kill switch stops every retry at once.
    ("kill switch", Policy(retry_safe_enabled=False), RetryDisabled),
    # contract §7.2: the attempt budget always applies (attempt 1 used of 1).
    ("budget", Policy(max_attempts=1), AttemptsExhausted),
    # ADR-010 R2: a tool forced to SIDE_EFFECT is never retried.
    (
        "forced side effect",
        Policy(effect_overrides=MappingProxyType({TOOL: SE})),
        ReconciliationRequired,
    ),
]


@pytest.mark.parametrize("effect", RETRYABLE, ids=lambda e: e.name)
@pytest.mark.parametrize(("why", "policy", "kind"), RETRY_REFUSALS)
def test_prepare_and_start_with_retry_obeys_the_retry_rules(
    effect: Effect, why: str, policy: Policy, kind: type[EffectdError]
) -> None:
    """The retry of prepare-and-start is decided by the retry rules in the same
    transaction: the kill switch and the attempt budget refuse it with their
    reason, changing nothing (issue 10 item 9: fails before the fix: EXECUTE
    came back whatever the policy said). A forced side effect answers
    RECONCILE instead: it is a decision, as for any UNKNOWN side effect."""
    call = unknown(effect)
    step = _prepare_retry(call, moment(), policy)
    if kind is ReconciliationRequired:
        assert answer(step).decision is Decision.RECONCILE
        assert not answer(step).attempt_held
        assert step.call.forced_effect is SE  # ADR-010 R2, recorded for good
    else:
        refusal(step, kind)
        assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
@pytest.mark.parametrize("retry", [False, True])
@pytest.mark.parametrize(
    "policy",
    [Policy(), Policy(retry_safe_enabled=False), Policy(max_attempts=1)],
    ids=["default", "kill-switch", "budget-1"],
)
def test_with_start_execute_always_holds_the_attempt(
    effect: Effect, state: State, retry: bool, policy: Policy
) -> None:
    """For every state, effect, retry flag and policy, a prepare with `start`
    that answers EXECUTE holds a new attempt (contract §5.2; issue 10 item 9:
    fails before the fix for UNKNOWN READ and IDEMPOTENT_WRITE)."""
    call = BUILD[state](effect)
    asked = dataclasses.replace(spec(effect, start=True), retry=retry)
    step = rules.prepare(call, asked, moment(), policy)
    assert start_violation(asked, call, step) == ""


def test_an_approval_rejection_is_answered_rejected_on_prepare() -> None:
    """A prepare of a rejected call answers REJECTED with the error result."""
    # contract §4.5 reject; §5.1 REJECTED (error result); ADR-010 D3.
    call = rejected(SE)
    reply = answer(rules.prepare(call, spec(SE, start=True), moment()))
    assert reply.decision is Decision.REJECTED
    assert reply.call.result is not None
    assert reply.call.result.error_code == APPROVAL_REJECTED


# --- require_approval on a repeat prepare (contract §4.5, ADR-010 D3) -------------


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize("start", [False, True])
def test_a_repeat_that_requires_approval_makes_a_prepared_call_wait(
    effect: Effect, start: bool
) -> None:
    """A call prepared without approval and re-prepared with require_approval
    (with or without start) waits for an approver: AWAIT_APPROVAL, no attempt
    held (issue 10 item 12: fails before the fix: with start it executed)."""
    call = prepared(effect)
    step = rules.prepare(
        call, spec(effect, require_approval=True, start=start), moment()
    )
    reply = answer(step)
    assert (reply.decision, reply.attempt_held) == (Decision.AWAIT_APPROVAL, False)
    assert (step.call.state, step.call.approval_required) == (
        State.AWAITING_APPROVAL,
        True,
    )
    assert step.call.history[-1].event is Event.REQUIRE_APPROVAL
    again = rules.prepare(step.call, spec(effect, start=True), moment())
    assert answer(again).decision is Decision.AWAIT_APPROVAL
    assert again.call == step.call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
@pytest.mark.parametrize("state", [ST, U, C], ids=lambda s: s.name)
def test_approval_cannot_be_required_after_the_call_started(
    effect: Effect, state: State
) -> None:
    """A call that started without approval cannot be made to require one:
    the repeat is INPUT_MISMATCH and nothing changes (issue 10 item 12: fails
    before the fix: its result or its decision came back as if approved)."""
    call = BUILD[state](effect)
    step = rules.prepare(
        call, spec(effect, require_approval=True, start=True), moment()
    )
    refused = refusal(step, InputMismatch)
    assert refused.metadata["state"] == state.name
    assert step.call is call


@pytest.mark.parametrize("effect", EFFECTS, ids=lambda e: e.name)
def test_a_repeat_without_approval_never_lifts_the_requirement(effect: Effect) -> None:
    """A call that requires approval keeps waiting when re-prepared without
    require_approval."""
    call = awaiting(effect)
    step = rules.prepare(call, spec(effect, start=True), moment())
    assert answer(step).decision is Decision.AWAIT_APPROVAL
    assert step.call is call
