"""The `effectd.v1.Checkpoints` service: translation only (its messages are
translated here; the namespace through `sidecar.rpc.convert`)."""

from __future__ import annotations

from typing import Any

import grpc
from effectd.v1 import checkpoints_pb2 as pb

from sidecar.ledger.checkpoints import Expect, Op, StoredCheckpoint
from sidecar.ledger.validation import Limits, Violations
from sidecar.rpc import caller, convert
from sidecar.services.checkpoints import CheckpointService

Context = grpc.aio.ServicerContext[Any, Any]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def checkpoint_key(
    v: Violations, value: str, limits: Limits, field: str = "key"
) -> str:
    v.text_id(field, value, limits.max_key_bytes)
    return value


def checkpoint_prefix(
    v: Violations, value: str, limits: Limits, field: str = "prefix"
) -> str:
    if value:
        v.text_id(field, value, limits.max_key_bytes)
    return value


def compare(v: Violations, msg: pb.Compare, limits: Limits, field: str) -> Expect:
    key = checkpoint_key(v, msg.key, limits, _join(field, "key"))
    which = msg.WhichOneof("expect")
    if which is None:
        v.add(field, "must set revision or absent")
    elif which == "absent" and not msg.absent:
        v.add(_join(field, "absent"), "must be true when set")
    elif which == "revision" and msg.revision == 0:
        v.add(_join(field, "revision"), "must be at least 1 (use absent for a new key)")
    return Expect(key, msg.revision if which == "revision" else None)


def txn_op(v: Violations, msg: pb.TxnOp, limits: Limits, field: str) -> Op:
    which = msg.WhichOneof("op")
    if which == "put":
        key = checkpoint_key(v, msg.put.key, limits, _join(field, "put.key"))
        v.size(_join(field, "put.value"), msg.put.value, limits.max_payload_bytes)
        return Op(key, msg.put.value)
    if which == "delete":
        return Op(
            checkpoint_key(v, msg.delete.key, limits, _join(field, "delete.key")), None
        )
    v.add(field, "must set put or delete")
    return Op("", None)


def checkpoint_pb(cp: StoredCheckpoint, *, value: bool = True) -> pb.Checkpoint:
    return pb.Checkpoint(
        key=cp.key,
        value=cp.value if value else b"",
        revision=cp.revision,
        updated_at=convert.timestamp(cp.updated_ns),
    )


class Checkpoints:
    def __init__(self, checkpoints: CheckpointService, limits: Limits) -> None:
        self._checkpoints = checkpoints
        self._limits = limits

    async def Get(
        self, req: pb.GetCheckpointRequest, _: Context
    ) -> pb.GetCheckpointResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        key = checkpoint_key(v, req.key, self._limits)
        v.require()
        found = await self._checkpoints.get(ns, key)
        return pb.GetCheckpointResponse(checkpoint=checkpoint_pb(found))

    async def Put(
        self, req: pb.PutCheckpointRequest, _: Context
    ) -> pb.PutCheckpointResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        key = checkpoint_key(v, req.key, self._limits)
        v.size("value", req.value, self._limits.max_payload_bytes)
        which = req.WhichOneof("precondition")
        if which is None:
            v.add("precondition", "is required: set expected_revision or expect_absent")
        elif which == "expect_absent" and not req.expect_absent:
            v.add("expect_absent", "must be true when set")
        elif which == "expected_revision" and req.expected_revision == 0:
            v.add(
                "expected_revision",
                "must be at least 1 (use expect_absent for a new key)",
            )
        v.require()
        expect = Expect(
            key, req.expected_revision if which == "expected_revision" else None
        )
        return pb.PutCheckpointResponse(
            revision=await self._checkpoints.put(ns, expect, req.value)
        )

    async def Delete(
        self, req: pb.DeleteCheckpointRequest, _: Context
    ) -> pb.DeleteCheckpointResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        key = checkpoint_key(v, req.key, self._limits)
        if req.expected_revision == 0:
            v.add("expected_revision", "is required")
        v.require()
        await self._checkpoints.delete(ns, key, req.expected_revision)
        return pb.DeleteCheckpointResponse()

    async def Txn(
        self, req: pb.CheckpointTxnRequest, _: Context
    ) -> pb.CheckpointTxnResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        limit = self._limits.max_txn_ops
        if len(req.compares) > limit:
            v.add("compares", f"must hold at most {limit} compares")
        if not 1 <= len(req.ops) <= limit:
            v.add("ops", f"must hold 1..{limit} ops")
        if len(req.compares) > limit or len(req.ops) > limit:
            v.require()  # before reading each of too many
        compares = [
            compare(v, c, self._limits, f"compares[{i}]")
            for i, c in enumerate(req.compares)
        ]
        ops = [txn_op(v, o, self._limits, f"ops[{i}]") for i, o in enumerate(req.ops)]
        compared: set[str] = set()
        for i, c in enumerate(compares):
            if c.key in compared:
                v.add(f"compares[{i}].key", "is compared twice")
            compared.add(c.key)
        written: set[str] = set()
        for i, op in enumerate(ops):
            if op.key in written:
                v.add(f"ops[{i}]", "writes a key twice")
            elif op.key and op.key not in compared:
                v.add(
                    f"ops[{i}]",
                    "writes a key that no compare guards (no unconditional writes)",
                )
            written.add(op.key)
        v.require()
        return pb.CheckpointTxnResponse(
            revision=await self._checkpoints.txn(ns, compares, ops)
        )

    async def List(
        self, req: pb.ListCheckpointsRequest, _: Context
    ) -> pb.ListCheckpointsResponse:
        v = Violations()
        ns = convert.namespace(v, caller.current(), req.namespace)
        prefix = checkpoint_prefix(v, req.prefix, self._limits)
        size = convert.page_size(v, req.page_size, self._limits)
        v.require()
        page = await self._checkpoints.list(
            ns, prefix=prefix, page_size=size, page_token=req.page_token
        )
        return pb.ListCheckpointsResponse(
            checkpoints=[
                checkpoint_pb(c, value=not req.keys_only) for c in page.checkpoints
            ],
            next_page_token=page.next_page_token,
        )
