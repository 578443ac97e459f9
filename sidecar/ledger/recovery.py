"""The recovery plan of contract §6 (ADR-010 D3) as pure functions.

After a crash an agent asks what to do with every call of its run. `action`
answers for one settled record; `plan` for a whole run. The plan only names
what to do: recovery itself never executes, starts or retries anything.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.ledger.model import Effect, State, ToolCall
from sidecar.ledger.policy import Policy


class RecoveryAction(enum.Enum):
    """What the agent does with one call when it resumes a run."""

    # Committed, not yet acknowledged: complete the transcript with the stored
    # result; do not call the tool.
    REPLAY_RESULT = "replay_result"
    # A side effect of unknown outcome: the run is interrupted until an
    # operator reconciles it.
    RECONCILE = "reconcile"
    # No approver decided yet: the run stays interrupted.
    WAIT_FOR_APPROVAL = "wait_for_approval"
    # Rejected by an approver: the transcript gets the stored error result.
    ERROR_RESULT = "error_result"
    # Approved, or never started: the agent may start it.
    EXECUTE = "execute"
    # A READ / IDEMPOTENT_WRITE of unknown outcome: eligible for an explicit
    # retry under the retry policy, never automatic.
    RETRY_NEEDS_POLICY = "retry_needs_policy"
    # Committed, and its result acknowledged as delivered to the transcript
    # (AcknowledgeRecovery): nothing to do; appending it again would repeat it.
    ALREADY_DELIVERED = "already_delivered"


# Actions that interrupt the run: the agent cannot go on by itself.
INTERRUPTING = frozenset({RecoveryAction.RECONCILE, RecoveryAction.WAIT_FOR_APPROVAL})


@dataclass(frozen=True, slots=True)
class PlanItem:
    call: ToolCall
    action: RecoveryAction
    # The effect the plan assumed (the policy's override wins, ADR-010 R2).
    effect: Effect


@dataclass(frozen=True, slots=True)
class Plan:
    items: tuple[PlanItem, ...]

    @property
    def interrupted(self) -> bool:
        """Some call needs a reconciliation or an approval first."""
        return any(item.action in INTERRUPTING for item in self.items)


def action(call: ToolCall, effect: Effect) -> RecoveryAction:
    """The action for one record, already settled, assuming `effect`."""
    match call.state:
        case State.COMMITTED:
            return _committed(call)
        case State.STARTED | State.UNKNOWN:
            # ADR-010 D3: started + side-effect -> manual reconciliation;
            # read / idempotent-write retries need an explicit policy.
            if effect is Effect.SIDE_EFFECT:
                return RecoveryAction.RECONCILE
            return RecoveryAction.RETRY_NEEDS_POLICY
        case State.AWAITING_APPROVAL:
            # ADR-010 D3: no decision yet -> stay interrupted.
            return RecoveryAction.WAIT_FOR_APPROVAL
        case State.PREPARED:
            # contract §6.1: approved or never started (or verified not executed
            # by a reconciliation, contract §4.6).
            return RecoveryAction.EXECUTE
    raise AssertionError(call.state)  # pragma: no cover


def _committed(call: ToolCall) -> RecoveryAction:
    return committed_action(acknowledged=call.acknowledged, rejected=call.rejected)


def committed_action(*, acknowledged: bool, rejected: bool) -> RecoveryAction:
    """The action for a COMMITTED record, whatever its effect."""
    # ADR-010 D1: a committed result is not appended again on recovery: once
    # acknowledged, it was delivered already.
    if acknowledged:
        return RecoveryAction.ALREADY_DELIVERED
    # ADR-010 D3: committed + result -> the stored result, no call; reject ->
    # an error result.
    if rejected:
        return RecoveryAction.ERROR_RESULT
    return RecoveryAction.REPLAY_RESULT


def plan(calls: Iterable[ToolCall], policy: Policy) -> Plan:
    """The plan for settled records, one item per call, in their order."""
    items = []
    for call in calls:
        effect = policy.effect_for(call)
        items.append(PlanItem(call, action(call, effect), effect))
    return Plan(tuple(items))
