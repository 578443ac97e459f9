"""What ends a run of `effectd_client.contrib.openai_agents`: `LedgerInterruption`,
which names, beside the call that stopped, every call of the run waiting
for a human. The Agents SDK ends a run at the first tool that raises (and
cancels the others), so the parallel calls of a step that all need a
human (after a crash: each of unknown outcome) would stop the run one per
restart; the interruption names them all, so that they are settled at once.
Imported only with the `openai-agents` extra.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from agents import AgentsException

from effectd_client import (
    AsyncClient,
    EffectdError,
    RecoveryAction,
    RecoveryPlan,
    State,
    ToolCall,
)

# The recovery actions that wait for a human.
HUMAN = frozenset(
    {
        RecoveryAction.RECONCILE,
        RecoveryAction.RETRY_NEEDS_POLICY,
        RecoveryAction.WAIT_FOR_APPROVAL,
    }
)


class LedgerInterruption(AgentsException):
    """The ledger stopped a tool call: the run ends here.

    `cause` is the client's reason: `ReconciliationNeeded` (a side effect of
    unknown outcome: an operator reconciles it), `ApprovalPending` (effectd
    has not approved this call), `CallInProgress`, `RetryRequired`, a refusal
    (`InputMismatch`: the same call id with other arguments), or what the
    tool raised just now when its outcome is unknown (recorded UNKNOWN; the
    only case in which the tool ran). `call` is the ledger's record of the
    call, and `calls` every call of the run that waits for a human now
    (UNKNOWN: to reconcile, or to retry; AWAITING_APPROVAL: to approve), in
    the daemon's judgement: the parallel calls of a step stop the run one at
    a time, and are settled together.
    """

    def __init__(self, cause: Exception, calls: Sequence[ToolCall] = ()) -> None:
        self.cause = cause
        self.call: ToolCall | None = getattr(cause, "call", None)
        self.calls = tuple(calls)
        waiting = ", ".join(
            f"{c.call_id} ({c.tool_name}, {c.state.name})" for c in self.calls
        )
        also = (
            f"; the calls of the run waiting for a human: {waiting}" if waiting else ""
        )
        super().__init__(f"effectd stopped the tool call: {cause}{also}")


async def interruption(
    client: AsyncClient, run_id: str, cause: Exception
) -> LedgerInterruption:
    """The interruption of the run by `cause`, naming every call of the run
    that waits for a human (Recover: the daemon's judgement, after expired
    leases became UNKNOWN; a call still running is not one).

    The parallel calls of a step killed together do not turn UNKNOWN
    together: each lease was last renewed at its own heartbeat. So while a
    call waits for a human and another is still STARTED, the others' leases
    are waited out (each at most its own lease, once) and the run recovered
    again: a sibling that died with the first is named now, not at the next
    resume; one whose attempt is alive renewed its lease and is not named.
    """
    try:
        plan = await client.recover(run_id)
        wait = _lease_left(plan)
        if wait > 0 and _waiting(plan):
            await asyncio.sleep(wait)
            plan = await client.recover(run_id)
    except EffectdError:
        return LedgerInterruption(cause)  # the cause says enough
    return LedgerInterruption(cause, _waiting(plan))


# Past a lease's end, before the run is recovered again.
_MARGIN_S = 0.05


def _waiting(plan: RecoveryPlan) -> list[ToolCall]:
    return [
        item.call
        for item in plan.items
        if item.action in HUMAN and item.call.state is not State.STARTED
    ]


def _lease_left(plan: RecoveryPlan) -> float:
    """Seconds until the last lease of the run's STARTED calls ends, each
    bounded by its own lease (the daemon's clock may not be ours)."""
    now = time.time_ns()
    left = [
        min(item.call.lease_expires_ns - now, item.call.lease_ms * 1_000_000)
        for item in plan.items
        if item.call.state is State.STARTED and item.call.lease_expires_ns
    ]
    return max(left, default=0) / 1e9 + _MARGIN_S if left else 0.0
