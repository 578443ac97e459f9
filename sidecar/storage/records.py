"""How ledger records and checkpoints are laid out in the store's tables.

Keys: `namespace NUL run NUL call`, each identity part in its stored form
(`storage.keys`: verbatim when short, hashed when long, so every identity
that validation accepts fits LMDB's key limit). Identifiers never contain
NUL or other control characters (see `ledger.validation`), so keys are
unambiguous, and a namespace or run is a key prefix. Values: versioned JSON
documents, which hold the readable identity. Every load and save of a record
goes through here, which keeps the by-state index in step with the records.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

from sidecar.ledger import audit
from sidecar.ledger.checkpoints import StoredCheckpoint
from sidecar.ledger.model import (
    FINGERPRINT_V1,
    FINGERPRINT_V2,
    Approval,
    CallRef,
    Channel,
    Effect,
    Event,
    Lease,
    Outcome,
    Payload,
    PayloadKind,
    Reconciliation,
    Resolution,
    Result,
    State,
    ToolCall,
    Transition,
    check_key_scheme,
)
from sidecar.storage import keys
from sidecar.storage.api import ReadView, Table, WriteView

_SEP = b"\x00"
RECORD_VERSION = 1
_STATE_CODES = {s: bytes([i + 1]) for i, s in enumerate(State)}


def namespace_prefix(namespace: str) -> bytes:
    return namespace.encode() + _SEP


def run_prefix(namespace: str, run_id: str) -> bytes:
    return namespace_prefix(namespace) + keys.part(run_id, keys.CALL_PART) + _SEP


def call_key(ref: CallRef) -> bytes:
    return run_prefix(ref.namespace, ref.run_id) + keys.part(
        ref.call_id, keys.CALL_PART
    )


def namespace_of(key: bytes) -> str:
    """The namespace of a key of CALLS, TOMBSTONES or CHECKPOINTS (of
    CALL_STATES without its state byte)."""
    return key.split(_SEP, 1)[0].decode()


def state_prefix(state: State, namespace: str | None = None) -> bytes:
    return _STATE_CODES[state] + (
        b"" if namespace is None else namespace_prefix(namespace)
    )


def load_call(view: ReadView, ref: CallRef) -> ToolCall | None:
    return load_call_at(view, call_key(ref))


def load_call_at(view: ReadView, key: bytes) -> ToolCall | None:
    """The record stored under `key` (a CALLS key, as in the by-state index)."""
    raw = view.get(Table.CALLS, key)
    return None if raw is None else decode_call(raw)


def save_call(view: WriteView, old: ToolCall | None, new: ToolCall) -> None:
    """Stores `new` (which replaces `old`, as loaded) and its index entry."""
    key = call_key(new.ref)
    if old is not None and old.state is not new.state:
        view.delete(Table.CALL_STATES, _STATE_CODES[old.state] + key)
    if old is None or old.state is not new.state:
        view.put(Table.CALL_STATES, _STATE_CODES[new.state] + key, b"")
    view.put(Table.CALLS, key, encode_call(new))


# -- the record document ---------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _payload_doc(p: Payload | None) -> dict[str, str] | None:
    return None if p is None else {"kind": p.kind.value, "data": _b64(p.data)}


def _payload(doc: dict[str, str] | None) -> Payload | None:
    if doc is None:
        return None
    return Payload(PayloadKind(doc["kind"]), base64.b64decode(doc["data"]))


def encode_call(c: ToolCall) -> bytes:
    doc: dict[str, Any] = {
        "v": RECORD_VERSION,
        "ref": [c.ref.namespace, c.ref.run_id, c.ref.call_id],
        "tool": c.tool_name,
        "effect": c.effect.value,
        "state": c.state.value,
        "rev": c.revision,
        "scheme": c.key_scheme,
        "fp": c.input_fingerprint,
        "fps": c.fingerprint_scheme,
        "approval": c.approval_required,
        "attempt": c.attempt,
        "created": c.created_ns,
        "updated": c.updated_ns,
        "ack": c.acknowledged,
        "lease": None
        if c.lease is None
        else [c.lease.incarnation, c.lease.deadline_ns, c.lease.expires_wall_ns],
        "result": None
        if c.result is None
        else {
            "outcome": c.result.outcome.value,
            "payload": _payload_doc(c.result.payload),
            "code": c.result.error_code,
            "message": c.result.error_message,
            "digest": c.result.digest,
        },
        "history": [
            [
                None if t.from_state is None else t.from_state.value,
                t.to_state.value,
                t.event.value,
                t.at_ns,
                t.actor,
                t.reason,
                t.revision,
                t.attempt,
            ]
            for t in c.history
        ],
        "approval_decision": _approval_doc(c.approval),
        "reconciliations": [_reconciliation_doc(r) for r in c.reconciliations],
        "lease_ms": c.lease_ms,
        "unknown_since": c.unknown_since_ns,
        "channel": c.channel.value,
        "forced": None if c.forced_effect is None else c.forced_effect.value,
    }
    if c.kept_input is not None:
        # Absent otherwise: a record without one is stored as before.
        doc["kept_input"] = _payload_doc(c.kept_input)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _approval_doc(a: Approval | None) -> list[Any] | None:
    if a is None:
        return None
    return [a.approved, a.approver, a.reason, a.at_ns, a.input_fingerprint, a.revision]


def _reconciliation_doc(r: Reconciliation) -> list[Any]:
    return [
        r.resolution.value,
        r.operator,
        r.reason,
        r.evidence,
        r.at_ns,
        r.from_state.value,
        r.revision,
        r.attempt,
    ]


def _approval(doc: list[Any] | None) -> Approval | None:
    return None if doc is None else Approval(*doc)


def _reconciliation(doc: list[Any]) -> Reconciliation:
    resolution, operator, reason, evidence, at, from_state, rev, attempt = doc
    return Reconciliation(
        Resolution(resolution),
        operator,
        reason,
        evidence,
        at,
        State(from_state),
        rev,
        attempt,
    )


class RecordFormatError(ValueError):
    """A stored record of a version this daemon cannot read."""


def decode_call(raw: bytes) -> ToolCall:
    """The record of a stored document; keys a later version may add are
    ignored, keys an earlier one lacked take their meaning of then.

    Raises:
        UnsupportedKeyScheme: the record's idempotency key scheme is unknown
            (ADR-010 R4): nothing may act on it with a key of another scheme.
        RecordFormatError: a record version this daemon cannot read.
    """
    doc = json.loads(raw)
    if doc.get("v") != RECORD_VERSION:
        raise RecordFormatError(f"record version {doc.get('v')!r}")
    check_key_scheme(doc["scheme"])
    r = doc["result"]
    lease = doc["lease"]
    return ToolCall(
        ref=CallRef(*doc["ref"]),
        tool_name=doc["tool"],
        effect=Effect(doc["effect"]),
        state=State(doc["state"]),
        revision=doc["rev"],
        key_scheme=doc["scheme"],
        input_fingerprint=doc["fp"],
        # Records stored before fingerprints named the input's kind.
        fingerprint_scheme=_fingerprint_scheme(doc.get("fps", FINGERPRINT_V1)),
        approval_required=doc["approval"],
        attempt=doc["attempt"],
        created_ns=doc["created"],
        updated_ns=doc["updated"],
        acknowledged=doc["ack"],
        lease=None if lease is None else Lease(*lease),
        result=None
        if r is None
        else Result(
            Outcome(r["outcome"]),
            _payload(r["payload"]),
            r["code"],
            r["message"],
            r["digest"],
        ),
        history=tuple(
            Transition(
                None if f is None else State(f),
                State(t),
                Event(e),
                at,
                actor,
                reason,
                rev,
                att,
            )
            for f, t, e, at, actor, reason, rev, att in doc["history"]
        ),
        # Records written before approvals and reconciliations were stored
        # have neither key.
        approval=_approval(doc.get("approval_decision")),
        reconciliations=tuple(
            _reconciliation(r) for r in doc.get("reconciliations", ())
        ),
        # Optional: records stored before these were kept have none.
        lease_ms=doc.get("lease_ms", 0),
        unknown_since_ns=doc.get("unknown_since", 0),
        channel=Channel(doc.get("channel", Channel.TOOL.value)),
        forced_effect=None if doc.get("forced") is None else Effect(doc["forced"]),
        # Records written before inputs were kept have no such key.
        kept_input=_payload(doc.get("kept_input")),
    )


def _fingerprint_scheme(scheme: int) -> int:
    if scheme not in (FINGERPRINT_V1, FINGERPRINT_V2):
        raise RecordFormatError(f"input fingerprint scheme {scheme!r}")
    return scheme


# -- checkpoints -------------------------------------------------------------

_REVISION_KEY = b"checkpoint_revision"
# Revision and last change; then, for a key stored hashed, the key's length
# and the key itself; then the value.
_CHECKPOINT_HEAD = struct.Struct(">QQ")
_KEY_LENGTH = struct.Struct(">H")


def checkpoint_key(namespace: str, key: str) -> bytes:
    return namespace_prefix(namespace) + keys.part(key, keys.CHECKPOINT_KEY)


def load_checkpoint(
    view: ReadView, namespace: str, key: str
) -> StoredCheckpoint | None:
    stored = checkpoint_key(namespace, key)
    raw = view.get(Table.CHECKPOINTS, stored)
    return None if raw is None else decode_checkpoint(stored, raw)


def decode_checkpoint(stored: bytes, raw: bytes) -> StoredCheckpoint:
    """The checkpoint stored under the key `stored`."""
    revision, updated_ns = _CHECKPOINT_HEAD.unpack_from(raw)
    body = raw[_CHECKPOINT_HEAD.size :]
    if keys.is_hashed(stored):
        (size,) = _KEY_LENGTH.unpack_from(body)
        start = _KEY_LENGTH.size
        key = body[start : start + size].decode()
        return StoredCheckpoint(key, body[start + size :], revision, updated_ns)
    return StoredCheckpoint(
        stored.split(_SEP, 1)[1].decode(), body, revision, updated_ns
    )


def encode_checkpoint(stored: bytes, cp: StoredCheckpoint) -> bytes:
    head = _CHECKPOINT_HEAD.pack(cp.revision, cp.updated_ns)
    if keys.is_hashed(stored):
        key = cp.key.encode()
        head += _KEY_LENGTH.pack(len(key)) + key
    return head + cp.value


def save_checkpoint(view: WriteView, namespace: str, cp: StoredCheckpoint) -> None:
    stored = checkpoint_key(namespace, cp.key)
    view.put(Table.CHECKPOINTS, stored, encode_checkpoint(stored, cp))


def delete_checkpoint(view: WriteView, namespace: str, key: str) -> None:
    view.delete(Table.CHECKPOINTS, checkpoint_key(namespace, key))


def checkpoint_ranges(namespace: str, prefix: str) -> list[bytes]:
    """The key ranges, in key order, that hold every checkpoint of
    `namespace` whose key starts with `prefix` (and may hold others).

    A key stored verbatim starts with the prefix itself. A key stored hashed
    starts with its first `kept` bytes: with a prefix no longer than those,
    the same range holds it; with a longer one, it is in the range of the
    prefix's first `kept` bytes and the marker, which sorts first."""
    base = namespace_prefix(namespace)
    data = prefix.encode()
    kept = keys.CHECKPOINT_KEY.kept
    if len(data) <= kept:
        return [base + data]
    return [base + data[:kept] + keys.HASHED, base + data]


def scan_checkpoints(
    view: ReadView, namespace: str, prefix: str, after: bytes | None
) -> Iterator[tuple[bytes, StoredCheckpoint]]:
    """(stored key, checkpoint) of every row of `checkpoint_ranges` after the
    stored key `after`, in key order; rows whose key does not start with
    `prefix` are included: the caller filters, and counts what it read."""
    for start in checkpoint_ranges(namespace, prefix):
        for stored, raw in view.scan(Table.CHECKPOINTS, start, after=after):
            yield stored, decode_checkpoint(stored, raw)


def skip_checkpoint_revisions(view: WriteView, gap: int) -> None:
    """Moves the checkpoint revision counter `gap` ahead (after a restore,
    past every revision a lost later state may have issued)."""
    revision = int(view.get(Table.META, _REVISION_KEY) or b"0") + gap
    view.put(Table.META, _REVISION_KEY, str(revision).encode())


def next_checkpoint_revision(view: WriteView) -> int:
    """The store-wide checkpoint revision counter: never reused, so no ABA."""
    revision = int(view.get(Table.META, _REVISION_KEY) or b"0") + 1
    view.put(Table.META, _REVISION_KEY, str(revision).encode())
    return revision


# -- the audit log -------------------------------------------------------------

_AUDIT_HEAD_KEY = b"audit_head"


def audit_key(sequence: int) -> bytes:
    return sequence.to_bytes(8, "big")


def load_audit_head(view: ReadView) -> audit.Head | None:
    """The chain head kept in META: the newest entry's sequence and hash."""
    raw = view.get(Table.META, _AUDIT_HEAD_KEY)
    if raw is None:
        return None
    sequence, digest = raw.decode().split(" ", 1)
    return audit.Head(int(sequence), digest)


def append_audit(view: WriteView, fact: audit.Fact) -> audit.Entry:
    """Seals `fact` after the current head and stores it with the new head,
    in the caller's write transaction."""
    entry = audit.seal(fact, load_audit_head(view))
    view.put(Table.AUDIT, audit_key(entry.sequence), audit.encode(entry))
    view.put(Table.META, _AUDIT_HEAD_KEY, f"{entry.sequence} {entry.hash}".encode())
    return entry


def load_audit(view: ReadView, sequence: int) -> bytes | None:
    return view.get(Table.AUDIT, audit_key(sequence))


def scan_audit(view: ReadView, after: int = 0) -> Iterator[tuple[int, bytes]]:
    """(sequence, stored bytes) of the entries after `after`, oldest first."""
    start = None if after == 0 else audit_key(after)
    for key, raw in view.scan(Table.AUDIT, b"", after=start):
        yield int.from_bytes(key, "big"), raw
