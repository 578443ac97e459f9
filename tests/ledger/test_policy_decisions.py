"""The operator's forced effect in the ledger rules (ADR-010 R2): a tool forced
to SIDE_EFFECT decides as one from the next request on, whatever its callers
declared, in every rule whose answer depends on the effect."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from sidecar.errors import ReconciliationRequired
from sidecar.ledger import rules
from sidecar.ledger.model import Decision, Effect, State, ToolCall
from sidecar.ledger.policy import Policy
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
    # DESIGN §5: an unknown READ / IDEMPOTENT_WRITE may be executed again
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
    RECONCILIATION_REQUIRED (DESIGN §4), not started."""
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
