"""The operator's forced effect in the ledger rules (ADR-010 R2): a tool forced
to SIDE_EFFECT decides as one from the next request on, whatever its callers
declared, in every rule whose answer depends on the effect."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MappingProxyType

import pytest

from sidecar.errors import ReconciliationRequired
from sidecar.ledger import rules
from sidecar.ledger.model import Decision, Effect, Event, State, ToolCall
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import Now, PrepareSpec, Step
from tests.ledger.builders import (
    LEASE_MS,
    TOOL,
    answer,
    committed,
    moment,
    prepared,
    refusal,
    spec,
    started,
    unknown,
)

FORCED = Policy(effect_overrides=MappingProxyType({TOOL: Effect.SIDE_EFFECT}))
OTHER_FORCED = Policy(effect_overrides=MappingProxyType({"other": Effect.SIDE_EFFECT}))

DECIDE = [
    # contract §5.1: an unknown READ / IDEMPOTENT_WRITE may be executed again
    # (by an explicit retry) ...
    ("unknown read", unknown(Effect.READ), None, Decision.EXECUTE),
    ("unknown write", unknown(Effect.IDEMPOTENT_WRITE), Policy(), Decision.EXECUTE),
    # ... ADR-010 R2: unless the operator forced the tool to SIDE_EFFECT.
    ("unknown read, forced", unknown(Effect.READ), FORCED, Decision.RECONCILE),
    (
        "unknown write, forced",
        unknown(Effect.IDEMPOTENT_WRITE),
        FORCED,
        Decision.RECONCILE,
    ),
    ("another tool forced", unknown(Effect.READ), OTHER_FORCED, Decision.EXECUTE),
    # ADR-010 D3: a side effect of unknown outcome reconciles either way.
    ("side effect", unknown(Effect.SIDE_EFFECT), None, Decision.RECONCILE),
    # The forced effect changes nothing where the effect decides nothing.
    ("prepared, forced", prepared(Effect.READ), FORCED, Decision.EXECUTE),
    ("started, forced", started(Effect.READ), FORCED, Decision.IN_PROGRESS),
    ("committed, forced", committed(Effect.READ), FORCED, Decision.RETURN_RESULT),
]


@pytest.mark.parametrize(
    ("call", "policy", "decision"),
    [row[1:] for row in DECIDE],
    ids=[row[0] for row in DECIDE],
)
def test_decide_under_the_policy(
    call: ToolCall, policy: Policy | None, decision: Decision
) -> None:
    """`decide` takes the policy's effect for the call's tool."""
    assert rules.decide(call, policy) is decision


def test_a_repeat_prepare_sees_the_forced_effect() -> None:
    """PrepareTool of an unknown READ of a forced tool answers RECONCILE, and
    no longer invites a retry."""
    now = moment()
    reply = answer(rules.prepare(unknown(Effect.READ), spec(Effect.READ), now, FORCED))
    assert (reply.decision, reply.retry_required) == (Decision.RECONCILE, False)
    plain = answer(rules.prepare(unknown(Effect.READ), spec(Effect.READ), now))
    assert (plain.decision, plain.retry_required) == (Decision.EXECUTE, True)


def test_report_unknown_sees_the_forced_effect() -> None:
    """ReportUnknown of a forced READ answers RECONCILE."""
    step = rules.report_unknown(
        started(Effect.READ), moment(), attempt=1, reason="lost", policy=FORCED
    )
    assert step.call.state is State.UNKNOWN
    assert answer(step).decision is Decision.RECONCILE


def test_a_retry_of_a_forced_tool_is_reconciliation() -> None:
    """StartTool(retry) of an unknown READ of a forced tool is refused
    RECONCILIATION_REQUIRED (contract §4.2), not started."""
    step = rules.start(
        unknown(Effect.READ),
        moment(),
        lease_ms=LEASE_MS,
        retry=True,
        expected_revision=None,
        policy=FORCED,
    )
    refusal(step, ReconciliationRequired)
    assert step.call.state is State.UNKNOWN


# -- the forced effect is recorded on the call: R2 is sticky ---------------------

Decider = Callable[[ToolCall | None, PrepareSpec, Now, Policy], Step]


def _forgets_the_call(
    existing: ToolCall | None, asked: PrepareSpec, now: Now, policy: Policy
) -> Step:
    """BROKEN on purpose, as the ledger was: the policy in force alone decides;
    nothing decided under an earlier one is remembered."""
    step = rules.prepare(existing, asked, now, policy)
    return Step(dataclasses.replace(step.call, forced_effect=None), step.reply)


def reopened(effect: Effect, prepare: Decider = rules.prepare) -> list[str]:
    """The R2 scenario: the tool is forced to SIDE_EFFECT, an UNKNOWN call of it
    answers RECONCILE; then the override is taken out of the policy. Returns
    what the call is offered afterwards that it must not be ([] if nothing)."""
    now = moment()
    call = unknown(effect, now)
    asked = dataclasses.replace(spec(effect, start=True), retry=True)
    first = prepare(call, asked, now, FORCED)
    assert answer(first).decision is Decision.RECONCILE
    found = []
    plain = prepare(first.call, spec(effect), now, Policy())
    if answer(plain).decision is not Decision.RECONCILE:
        found.append(f"prepare: {answer(plain).decision.name}")
    again = prepare(first.call, asked, now, Policy())
    if isinstance(again.reply, rules.Answer) and again.reply.attempt_held:
        found.append(f"retry: attempt {again.call.attempt} held")
    start = rules.start(
        first.call,
        now,
        lease_ms=LEASE_MS,
        retry=True,
        expected_revision=None,
        policy=Policy(),
    )
    if isinstance(start.reply, rules.Answer) and start.reply.attempt_held:
        found.append(f"StartTool(retry): attempt {start.call.attempt} held")
    return found


@pytest.mark.parametrize("effect", [Effect.READ, Effect.IDEMPOTENT_WRITE])
def test_a_call_decided_under_the_override_stays_a_side_effect(effect: Effect) -> None:
    """Taking the override out of the policy does not reopen retries of a call
    that was answered RECONCILE under it: the forced effect was recorded on
    the call, with its history entry (issue 10 item 10: fails before the fix:
    EXECUTE, and StartTool(retry) started attempt 2)."""
    assert reopened(effect) == []
    call = rules.prepare(unknown(effect), spec(effect), moment(), FORCED).call
    assert call.forced_effect is Effect.SIDE_EFFECT
    entry = call.history[-1]
    assert (entry.event, entry.actor, entry.to_state) == (
        Event.FORCE_SIDE_EFFECT,
        rules.DAEMON,
        State.UNKNOWN,
    )
    assert rules.prepare(call, spec(effect), moment(), FORCED).call == call


@pytest.mark.parametrize("effect", [Effect.READ, Effect.IDEMPOTENT_WRITE])
def test_negative_control_a_ledger_that_forgets_the_override_is_caught(
    effect: Effect,
) -> None:
    """The scenario's checker catches a ledger that decides by the policy in
    force alone."""
    assert reopened(effect, _forgets_the_call) == [
        "prepare: EXECUTE",
        "retry: attempt 2 held",
        "StartTool(retry): attempt 2 held",
    ]


def test_a_new_call_of_a_forced_tool_records_the_override() -> None:
    """A call created while its tool is forced is a side effect for good; one
    of another tool, or declared SIDE_EFFECT, records nothing."""
    now = moment()
    forced = rules.prepare(None, spec(Effect.READ), now, FORCED).call
    assert forced.forced_effect is Effect.SIDE_EFFECT
    assert forced.revision == 1
    assert (
        rules.prepare(None, spec(Effect.READ), now, OTHER_FORCED).call.forced_effect
        is None
    )
    assert (
        rules.prepare(None, spec(Effect.SIDE_EFFECT), now, FORCED).call.forced_effect
        is None
    )


def test_a_committed_call_records_nothing() -> None:
    """A committed call has nothing left to decide: it stays as it is."""
    call = committed(Effect.READ)
    assert rules.prepare(call, spec(Effect.READ), moment(), FORCED).call is call


# -- IDEMPOTENT_WRITE needs proof when the policy says so (ADR-010 compat.) -----

PROOF = Policy(idempotency_proof_required=True)
PROVEN = Policy(
    idempotency_proof_required=True, proven_idempotent_tools=frozenset({TOOL})
)


@pytest.mark.parametrize(
    ("policy", "decision", "retried"),
    [
        (Policy(), Decision.EXECUTE, True),  # self-declared counts by default
        (PROOF, Decision.RECONCILE, False),  # not proven: a SIDE_EFFECT
        (PROVEN, Decision.EXECUTE, True),  # proven by its owner's tests
    ],
    ids=["default", "proof-required", "proven"],
)
def test_an_unproven_idempotent_write_is_a_side_effect(
    policy: Policy, decision: Decision, retried: bool
) -> None:
    """Under `require_idempotency_proof`, an UNKNOWN IDEMPOTENT_WRITE of a tool
    not listed as proven answers RECONCILE and is never retried; listed, it is
    retry-safe again (issue 10 item 16: fails before the fix: a self-declared
    IDEMPOTENT_WRITE was always retried)."""
    now = moment()
    call = unknown(Effect.IDEMPOTENT_WRITE, now)
    assert (
        answer(rules.prepare(call, spec(Effect.IDEMPOTENT_WRITE), now, policy)).decision
        is decision
    )
    step = rules.start(
        call, now, lease_ms=LEASE_MS, retry=True, expected_revision=None, policy=policy
    )
    if retried:
        assert answer(step).attempt_held
    else:
        refusal(step, ReconciliationRequired)


def test_a_read_never_needs_proof() -> None:
    """A READ is retry-safe whatever the proof setting says (ADR-010 D6)."""
    now = moment()
    call = unknown(Effect.READ, now)
    step = rules.start(
        call, now, lease_ms=LEASE_MS, retry=True, expected_revision=None, policy=PROOF
    )
    assert answer(step).attempt_held
