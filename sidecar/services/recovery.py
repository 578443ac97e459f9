"""The recovery service: applies `ledger.recovery` to the stored calls of a run.

`recover` settles and plans a run in one write transaction, so the plan an
agent gets is the durable state: a STARTED call found stale is UNKNOWN on
disk before the plan that says RECONCILE is released. Nothing here starts or
executes a call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import EffectdError, NotFound
from sidecar.ledger import machine, recovery, rules
from sidecar.ledger.model import CallRef, Event, State, ToolCall
from sidecar.ledger.policy import PolicySource
from sidecar.ledger.rules import Now
from sidecar.ledger.validation import Limits
from sidecar.services._common import committed, moment
from sidecar.storage import records
from sidecar.storage.api import Store, Table, WriteView


@dataclass(frozen=True, slots=True)
class Recovered:
    plan: recovery.Plan
    # STARTED calls this recovery turned UNKNOWN.
    settled: int


class RecoveryService:
    def __init__(
        self, store: Store, clock: Clock, limits: Limits, policy: PolicySource
    ) -> None:
        self._store = store
        self._clock = clock
        self.limits = limits
        self._policy = policy

    def now(self) -> Now:
        return moment(self._clock, self._store)

    async def recover(self, namespace: str, run_id: str) -> Recovered:
        """The plan of a run, after stale STARTED calls became UNKNOWN."""
        prefix = records.run_prefix(namespace, run_id)

        def apply(view: WriteView) -> Recovered:
            now = self.now()
            # In the write transaction: a reload that took effect decides.
            policy = self._policy.current()
            stored = [
                records.decode_call(raw) for _, raw in view.scan(Table.CALLS, prefix)
            ]
            calls = []
            settled = 0
            for old in stored:
                new = rules.settle(old, now)
                settled += new.revision != old.revision
                # ADR-010 R2: a plan made under a forced effect holds the call.
                new = rules.enforce(new, policy, now)
                if new.revision != old.revision:
                    records.save_call(view, old, new)
                calls.append(new)
            return Recovered(recovery.plan(calls, policy), settled)

        return await committed(self._store, apply)

    async def acknowledge(
        self, namespace: str, run_id: str, call_ids: Sequence[str]
    ) -> list[ToolCall]:
        """Marks committed calls as delivered; all of them or none."""

        def apply(view: WriteView) -> list[ToolCall]:
            now = self.now()
            done = []
            for index, call_id in enumerate(call_ids):
                try:
                    done.append(
                        _acknowledge(view, CallRef(namespace, run_id, call_id), now)
                    )
                except EffectdError as exc:
                    exc.metadata["index"] = str(index)
                    raise
            return done

        return await committed(self._store, apply)


def _acknowledge(view: WriteView, ref: CallRef, now: Now) -> ToolCall:
    old = records.load_call(view, ref)
    if old is None:
        raise NotFound(
            f"no tool call {ref.run_id}:{ref.call_id} in namespace {ref.namespace}",
            {"namespace": ref.namespace, "runId": ref.run_id, "callId": ref.call_id},
        )
    if old.state is State.COMMITTED and old.acknowledged:
        return old
    # machine.apply refuses ACKNOWLEDGE in any state but COMMITTED.
    new = machine.apply(
        old, Event.ACKNOWLEDGE, at_ns=now.wall_ns, actor=rules.AGENT, acknowledged=True
    )
    records.save_call(view, old, new)
    return new
