"""The `effectd.v1.Recovery` service: translation only."""

from __future__ import annotations

from typing import Any

import grpc
from effectd.v1 import recovery_pb2 as pb

from sidecar.errors import FieldViolation, InvalidArgument
from sidecar.ledger.model import Effect
from sidecar.ledger.recovery import PlanItem, RecoveryAction
from sidecar.ledger.validation import Violations
from sidecar.rpc import caller, convert
from sidecar.services.recovery import RecoveryService

Context = grpc.aio.ServicerContext[Any, Any]

ACTION_TO_PB = {
    a: pb.RecoveryAction.Value(f"RECOVERY_ACTION_{a.name}") for a in RecoveryAction
}
# A Recover without page_size answers the whole plan in one message only up
# to this size: the default maximum message a gRPC client receives.
UNPAGED_LIMIT_BYTES = 4 << 20
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


def _field_bytes(size: int) -> int:
    """The bytes an item of `size` bytes takes in its message: a one-byte
    tag, its length as a varint, itself."""
    return 1 + max(1, (size.bit_length() + 6) // 7) + size


def _too_big() -> FieldViolation:
    return FieldViolation(
        "page_size",
        f"the plan of this run exceeds {UNPAGED_LIMIT_BYTES >> 20} MiB in one "
        f"answer: set page_size and follow next_page_token",
    )


class Recovery:
    def __init__(self, recovery: RecoveryService) -> None:
        self._recovery = recovery
        self._limits = recovery.limits

    async def Recover(self, req: pb.RecoverRequest, _: Context) -> pb.RecoverResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        v.text_id("run_id", req.run_id, self._limits.max_id_bytes, no_colon=True)
        if req.page_size:
            v.bounded("page_size", req.page_size, 1, self._limits.max_page_size)
        v.require()
        if req.page_size:
            page = await self._recovery.recover_page(
                ns, req.run_id, page_size=req.page_size, page_token=req.page_token
            )
            return pb.RecoverResponse(
                items=[item_pb(i) for i in page.plan.items],
                interrupted=page.plan.interrupted,
                settled=page.settled,
                next_page_token=page.next_page_token,
            )
        return await self._whole_plan(ns, req.run_id, req.page_token)

    async def _whole_plan(
        self, ns: str, run_id: str, page_token: str
    ) -> pb.RecoverResponse:
        """The rest of the plan after `page_token` in one answer, made page by
        page; refused once it would exceed `UNPAGED_LIMIT_BYTES`."""
        answer = pb.RecoverResponse()
        size = 0
        token = page_token
        while True:
            page = await self._recovery.recover_page(
                ns, run_id, page_size=self._limits.max_page_size, page_token=token
            )
            for item in page.plan.items:
                msg = item_pb(item)
                size += _field_bytes(msg.ByteSize())
                if size > UNPAGED_LIMIT_BYTES:
                    raise InvalidArgument([_too_big()])
                answer.items.append(msg)
            answer.interrupted |= page.plan.interrupted
            answer.settled += page.settled
            token = page.next_page_token
            if not token:
                return answer

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
