"""How tombstones of compacted calls are laid out in the store (DESIGN §4).

A tombstone lives in `Table.TOMBSTONES` under the key the record had in
`Table.CALLS` (see `records.call_key`), as a versioned JSON document.
`compact` replaces a record by its tombstone, index entry included, in the
caller's write transaction, so a call is always either a record or a
tombstone, never both and never neither.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.ledger.model import CallRef, Effect, Outcome, ToolCall
from sidecar.ledger.retention import Tombstone
from sidecar.storage import records
from sidecar.storage.api import ReadView, Table, WriteView

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
    )


def load(view: ReadView, ref: CallRef) -> Tombstone | None:
    raw = view.get(Table.TOMBSTONES, records.call_key(ref))
    return None if raw is None else decode(raw)


def compact(view: WriteView, call: ToolCall, tomb: Tombstone) -> None:
    """Replaces the stored record `call` (as loaded) by `tomb`."""
    if tomb.ref != call.ref:
        raise ValueError("the tombstone is of another call")
    key = records.call_key(call.ref)
    view.delete(Table.CALL_STATES, records.state_prefix(call.state) + key)
    view.delete(Table.CALLS, key)
    view.put(Table.TOMBSTONES, key, encode(tomb))
