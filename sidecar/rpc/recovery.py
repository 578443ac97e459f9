"""The `effectd.v1.Recovery` service: translation only."""

from __future__ import annotations

from typing import Any

import grpc
from effectd.v1 import recovery_pb2 as pb

from sidecar.ledger.model import Effect
from sidecar.ledger.recovery import PlanItem, RecoveryAction
from sidecar.ledger.validation import Violations
from sidecar.rpc import caller, convert
from sidecar.services.recovery import RecoveryService

Context = grpc.aio.ServicerContext[Any, Any]

ACTION_TO_PB = {
    a: pb.RecoveryAction.Value(f"RECOVERY_ACTION_{a.name}") for a in RecoveryAction
}
# Actions whose item carries the stored result.
_WITH_RESULT = frozenset({RecoveryAction.REPLAY_RESULT, RecoveryAction.ERROR_RESULT})


def item_pb(item: PlanItem) -> pb.RecoveryItem:
    call = convert.call_pb(item.call, history=False)
    msg = pb.RecoveryItem(
        action=ACTION_TO_PB[item.action],
        call=call,
        effect=convert.EFFECT_TO_PB[item.effect],
    )
    if item.action in _WITH_RESULT:
        msg.result.CopyFrom(call.result)
    if item.effect is Effect.IDEMPOTENT_WRITE:
        msg.idempotency_key = item.call.idempotency_key
    return msg


class Recovery:
    def __init__(self, recovery: RecoveryService) -> None:
        self._recovery = recovery
        self._limits = recovery.limits

    async def Recover(self, req: pb.RecoverRequest, _: Context) -> pb.RecoverResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        v.text_id("run_id", req.run_id, self._limits.max_id_bytes, no_colon=True)
        v.require()
        recovered = await self._recovery.recover(ns, req.run_id)
        return pb.RecoverResponse(
            items=[item_pb(i) for i in recovered.plan.items],
            interrupted=recovered.plan.interrupted,
            settled=recovered.settled,
        )

    async def AcknowledgeRecovery(
        self, req: pb.AcknowledgeRecoveryRequest, _: Context
    ) -> pb.AcknowledgeRecoveryResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        v.text_id("run_id", req.run_id, self._limits.max_id_bytes, no_colon=True)
        count, most = len(req.call_ids), self._limits.max_batch
        if not 1 <= count <= most:
            v.add("call_ids", f"must hold 1..{most} call ids, got {count}")
            v.require()  # before reading each of too many
        seen: dict[str, int] = {}
        for i, call_id in enumerate(req.call_ids):
            v.text_id(f"call_ids[{i}]", call_id, self._limits.max_id_bytes)
            if call_id in seen:
                v.add(f"call_ids[{i}]", f"repeats call_ids[{seen[call_id]}]")
            seen.setdefault(call_id, i)
        v.require()
        calls = await self._recovery.acknowledge(ns, req.run_id, list(req.call_ids))
        return pb.AcknowledgeRecoveryResponse(calls=[convert.call_pb(c) for c in calls])
