"""Writes `format2.tar.gz`: a store of format 2, made by effectd before
store format 3 (run it with that version of `sidecar` on the path; it uses
only services whose interface both versions share).

    python tests/storage/old_stores/make_format2.py OUT_DIR

The store holds what an upgrade must carry over: calls in every state with
JSON and raw inputs fingerprinted without their kind, one waiting for an
approval, identities and a checkpoint key as long as format 2 could store
(stored verbatim in keys of up to 511 bytes), tombstones of a short and a
long identity, and audit entries. `test_migration.py` names each of them.
"""

from __future__ import annotations

import asyncio
import sys
import tarfile
from pathlib import Path

from sidecar.clock import ManualClock
from sidecar.ledger.checkpoints import Expect
from sidecar.ledger.fingerprint import fingerprint, result_digest
from sidecar.ledger.model import (
    CallRef,
    Effect,
    Outcome,
    Payload,
    PayloadKind,
    Result,
)
from sidecar.ledger.operator_rules import ApprovalDecision
from sidecar.ledger.policy import FixedPolicy, Policy
from sidecar.ledger.rules import PrepareSpec
from sidecar.ledger.validation import Limits
from sidecar.services.checkpoints import CheckpointService
from sidecar.services.ledger import LedgerService
from sidecar.services.operator import OperatorService
from sidecar.services.recovery import RecoveryService
from sidecar.services.retention import RetentionService
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore

NS = "default"
RUN = "run-1"
# "default" NUL run NUL call, plus the state byte of the index: 510 bytes,
# the longest identity format 2 could store in this namespace.
LONG_RUN = "r" * 250
LONG_CALL = "c" * 250
LONG_KEY = "k" * 500  # "default" NUL key: 508 bytes
JSON_INPUT = Payload(PayloadKind.JSON, b'{"b": 1, "a": 2.0}')
RAW_INPUT = Payload(PayloadKind.RAW, b"1")


def spec(ref: CallRef, payload: Payload, *, approval: bool = False) -> PrepareSpec:
    return PrepareSpec(
        ref=ref,
        tool_name="tool",
        effect=Effect.SIDE_EFFECT,
        input=payload,
        fingerprint=fingerprint(payload),
        require_approval=approval,
        start=False,
        lease_ms=60_000,
    )


def ok(text: bytes) -> Result:
    payload = Payload(PayloadKind.JSON, text)
    return Result(
        Outcome.OK, payload, "", "", result_digest(Outcome.OK, payload, "", "")
    )


async def fill(store: LmdbStore, clock: ManualClock) -> None:
    policy = FixedPolicy(Policy(retention_seconds=3600))
    ledger = LedgerService(store, clock, Limits(), policy)
    recovery = RecoveryService(store, clock, Limits(), policy)
    operator = OperatorService(store, clock, Limits())
    retention = RetentionService(store, clock, policy)
    checkpoints = CheckpointService(store, clock)

    async def commit(ref: CallRef, payload: Payload, result: bytes) -> None:
        await ledger.prepare(spec(ref, payload))
        held = await ledger.start(ref, lease_ms=0, retry=False, expected_revision=None)
        await ledger.commit(
            ref, attempt=held.call.attempt, result=ok(result), expected_revision=None
        )

    # Compacted first: acknowledged, then past the retention window.
    for ref in (CallRef(NS, RUN, "gone"), CallRef(NS, LONG_RUN, "gone-" + "g" * 240)):
        await commit(ref, JSON_INPUT, b'{"done": true}')
        await recovery.acknowledge(ref.namespace, ref.run_id, [ref.call_id])
    clock.advance(7200)
    await retention.compact()

    await ledger.prepare(spec(CallRef(NS, RUN, "json-prepared"), JSON_INPUT))
    await ledger.prepare(spec(CallRef(NS, RUN, "raw-prepared"), RAW_INPUT))
    await commit(CallRef(NS, RUN, "raw-committed"), RAW_INPUT, b'{"n": 1}')
    await ledger.prepare(spec(CallRef(NS, RUN, "awaiting"), JSON_INPUT, approval=True))
    approved = CallRef(NS, RUN, "approved")
    waiting = await ledger.prepare(spec(approved, RAW_INPUT, approval=True))
    await operator.decide_approval(
        approved,
        ApprovalDecision(
            approve=True,
            approver="alice",
            reason="fine",
            expected_revision=waiting.call.revision,
            input_fingerprint=waiting.call.input_fingerprint,
        ),
    )
    started = CallRef(NS, RUN, "started")
    await ledger.prepare(spec(started, JSON_INPUT))
    await ledger.start(started, lease_ms=0, retry=False, expected_revision=None)
    await commit(CallRef(NS, LONG_RUN, LONG_CALL), RAW_INPUT, b'{"long": true}')
    await ledger.prepare(spec(CallRef("other", LONG_RUN, "x"), JSON_INPUT))

    await checkpoints.put(NS, Expect("a/1", None), b"one")
    await checkpoints.put(NS, Expect("a/2", None), b"two")
    await checkpoints.put(NS, Expect(LONG_KEY, None), b"long")
    await checkpoints.put("other", Expect("a/1", None), b"other")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = out / "store"
    store = LmdbStore(data, LmdbOptions(map_size=16 << 20, sync=False))
    try:
        asyncio.run(fill(store, ManualClock()))
        snapshot = out / "snapshot"
        store.backup(snapshot)
    finally:
        store.close()
    with tarfile.open(out / "format2.tar.gz", "w:gz") as tar:
        tar.add(snapshot / "data.mdb", arcname="data.mdb")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
