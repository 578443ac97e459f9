"""The `effectd.v1.Recovery` service: translation only.

A Recover answer is written as bytes in the wire form of `RecoverResponse`
(served as they are, `sidecar.rpc.handlers`): an item the service planned
is built as a message and serialized; an item it answered from a plan row
(`StoredItem`) is framed around the row's stored summary, which is already
in the wire form of `ToolCall`. A repeated field is its items' bytes one
after the other, so both kinds sit side by side in one answer, byte for
byte what the message built item by item would serialize to
(tests/rpc/test_recovery_bytes.py).
"""

from __future__ import annotations

from typing import Any

import grpc
from effectd.v1 import recovery_pb2 as pb

from sidecar.errors import FieldViolation, InvalidArgument
from sidecar.ledger.model import Effect
from sidecar.ledger.recovery import PlanItem, RecoveryAction
from sidecar.ledger.validation import Violations
from sidecar.rpc import caller, convert
from sidecar.services.recovery import RecoveredRows, RecoveryService, StoredItem

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


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]
# RecoveryItem: action (1, varint), call (2, bytes), result (3, bytes),
# effect (4, varint), idempotency_key (5, bytes); RecoverResponse: items (1),
# interrupted (2), settled (3), next_page_token (4). Keyed by identity: an
# Enum's own hash is a Python function, and these are looked up per item.
_ACTION_FIELD = {id(a): b"\x08" + _varint(v) for a, v in ACTION_TO_PB.items()}
_EFFECT_FIELD = {id(e): b"\x20" + _varint(v) for e, v in convert.EFFECT_TO_PB.items()}
_WITH_RESULT_IDS = frozenset(id(a) for a in _WITH_RESULT)
_KEYED = Effect.IDEMPOTENT_WRITE


def stored_item_bytes(item: StoredItem) -> bytes:
    """The wire form of the `RecoveryItem` of a stored item, as `item_pb`
    would serialize it from the decoded record."""
    action, effect, summary, result, key = item
    parts = [_ACTION_FIELD[id(action)], b"\x12", _varint(len(summary)), summary]
    if id(action) in _WITH_RESULT_IDS:
        parts += (b"\x1a", result)
    parts.append(_EFFECT_FIELD[id(effect)])
    if effect is _KEYED and key:
        parts += (b"\x2a", key)
    return b"".join(parts)


def item_bytes(item: PlanItem | StoredItem) -> bytes:
    """One entry of `RecoverResponse.items`: its tag, length and item."""
    if type(item) is StoredItem:
        body = stored_item_bytes(item)
    else:
        body = item_pb(item).SerializeToString()  # type: ignore[arg-type]
    return b"\x0a" + _varint(len(body)) + body


def _tail(interrupted: bool, settled: int, next_page_token: str) -> bytes:
    """The fields of `RecoverResponse` after its items (proto3: unset
    when zero)."""
    out = b"\x10\x01" if interrupted else b""
    if settled:
        out += b"\x18" + _varint(settled)
    if next_page_token:
        token = next_page_token.encode()
        out += b"\x22" + _varint(len(token)) + token
    return out


def page_bytes(page: RecoveredRows) -> bytes:
    """The wire form of the `RecoverResponse` of one page."""
    items = b"".join([item_bytes(item) for item in page.items])
    return items + _tail(page.interrupted, page.settled, page.next_page_token)


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

    async def Recover(self, req: pb.RecoverRequest, _: Context) -> bytes:
        """The plan, in the wire form of `RecoverResponse`."""
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        v.text_id("run_id", req.run_id, self._limits.max_id_bytes, no_colon=True)
        if req.page_size:
            v.bounded("page_size", req.page_size, 1, self._limits.max_page_size)
        v.require()
        if req.page_size:
            page = await self._recovery.recover_rows(
                ns, req.run_id, page_size=req.page_size, page_token=req.page_token
            )
            return page_bytes(page)
        return await self._whole_plan(ns, req.run_id, req.page_token)

    async def _whole_plan(self, ns: str, run_id: str, page_token: str) -> bytes:
        """The rest of the plan after `page_token` in one answer, made page by
        page; refused once it would exceed `UNPAGED_LIMIT_BYTES`."""
        items: list[bytes] = []
        interrupted = False
        settled = size = 0
        token = page_token
        while True:
            page = await self._recovery.recover_rows(
                ns, run_id, page_size=self._limits.max_page_size, page_token=token
            )
            for item in page.items:
                entry = item_bytes(item)
                size += len(entry)
                if size > UNPAGED_LIMIT_BYTES:
                    raise InvalidArgument([_too_big()])
                items.append(entry)
            interrupted |= page.interrupted
            settled += page.settled
            token = page.next_page_token
            if not token:
                return b"".join(items) + _tail(interrupted, settled, "")

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
        return pb.AcknowledgeRecoveryResponse(
            calls=[convert.agent_call_pb(c) for c in calls]
        )
