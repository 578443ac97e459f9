"""How tombstones of compacted calls are laid out in the store (contract §4.7).

A tombstone lives in `Table.TOMBSTONES` under the key the record had in
`Table.CALLS` (see `keys.call_key`), as a versioned JSON document, and in
`Table.TOMBSTONE_TIMES` by the time it was made. `compact` replaces a record
by its tombstone, index entries included (the retention index's too), in
the caller's write transaction, so a call is always either a record or a
tombstone, never both and never neither, until `expire` deletes the
tombstone after its lifetime.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.ledger.model import (
    FINGERPRINT_V1,
    FINGERPRINT_V2,
    CallRef,
    Effect,
    Outcome,
    ToolCall,
    check_key_scheme,
)
from sidecar.ledger.retention import Tombstone
from sidecar.storage import keys, records, retention_times
from sidecar.storage.api import Table, Tables, WritableTables

TOMBSTONE_VERSION = 1


class TombstoneFormatError(ValueError):
    """A stored tombstone of a version this daemon cannot read."""


def encode(t: Tombstone) -> bytes:
    doc: dict[str, Any] = {
        "v": TOMBSTONE_VERSION,
        "ref": [t.ref.namespace, t.ref.run_id, t.ref.call_id],
        "tool": t.tool_name,
        "effect": t.effect.value,
        "scheme": t.key_scheme,
        "fp": t.input_fingerprint,
        "fps": t.fingerprint_scheme,
        "ack": t.acknowledged,
        "outcome": t.outcome.value,
        "digest": t.result_digest,
        "code": t.error_code,
        "rev": t.revision,
        "attempt": t.attempt,
        "created": t.created_ns,
        "committed": t.committed_ns,
        "changed": t.last_change_ns,
        "compacted": t.compacted_ns,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def decode(raw: bytes) -> Tombstone:
    doc = json.loads(raw)
    if doc.get("v") != TOMBSTONE_VERSION:
        raise TombstoneFormatError(f"tombstone version {doc.get('v')!r}")
    check_key_scheme(doc["scheme"])
    fingerprint_scheme = doc.get("fps", FINGERPRINT_V1)
    if fingerprint_scheme not in (FINGERPRINT_V1, FINGERPRINT_V2):
        raise TombstoneFormatError(f"fingerprint scheme {fingerprint_scheme!r}")
    return Tombstone(
        ref=CallRef(*doc["ref"]),
        tool_name=doc["tool"],
        effect=Effect(doc["effect"]),
        key_scheme=doc["scheme"],
        input_fingerprint=doc["fp"],
        outcome=Outcome(doc["outcome"]),
        result_digest=doc["digest"],
        error_code=doc["code"],
        revision=doc["rev"],
        attempt=doc["attempt"],
        created_ns=doc["created"],
        committed_ns=doc["committed"],
        last_change_ns=doc["changed"],
        compacted_ns=doc["compacted"],
        # Tombstones made before these were stored: fingerprints without the
        # input's kind, and only acknowledged results were compacted.
        fingerprint_scheme=fingerprint_scheme,
        acknowledged=doc.get("ack", True),
    )


def load(view: Tables, ref: CallRef) -> Tombstone | None:
    raw = view.get(Table.TOMBSTONES, keys.call_key(ref))
    return None if raw is None else decode(raw)


def time_key(compacted_ns: int, key: bytes) -> bytes:
    """The `Table.TOMBSTONE_TIMES` key of the tombstone stored under `key`."""
    return compacted_ns.to_bytes(8, "big") + key


def compact(view: WritableTables, call: ToolCall, tomb: Tombstone) -> None:
    """Replaces the stored record `call` (as loaded) by `tomb`."""
    if tomb.ref != call.ref:
        raise ValueError("the tombstone is of another call")
    key = keys.call_key(call.ref)
    view.delete(Table.CALL_STATES, records.state_prefix(call.state) + key)
    indexed = retention_times.key(call, key)
    if indexed is not None:
        view.delete(Table.RETENTION_TIMES, indexed)
    view.delete(Table.PLAN_ROWS, key)
    view.delete(Table.CALLS, key)
    view.put(Table.TOMBSTONES, key, encode(tomb))
    view.put(Table.TOMBSTONE_TIMES, time_key(tomb.compacted_ns, key), b"")


def expire(view: WritableTables, before_ns: int, limit: int) -> tuple[int, bool]:
    """Deletes the tombstones made before `before_ns`, oldest first, at most
    `limit` of them; returns how many, and whether more may be due."""
    due = []
    for index_key, _ in view.scan(Table.TOMBSTONE_TIMES, b""):
        if int.from_bytes(index_key[:8], "big") >= before_ns:
            break
        due.append(index_key)
        if len(due) == limit:
            break
    for index_key in due:
        view.delete(Table.TOMBSTONE_TIMES, index_key)
        view.delete(Table.TOMBSTONES, index_key[8:])
    return len(due), len(due) == limit
