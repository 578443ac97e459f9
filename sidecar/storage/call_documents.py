"""How a ledger record is stored: `encode_call` turns a `ToolCall` into a
versioned JSON document, which holds the readable identity, and
`decode_call` reads it back, refusing a document of another version or a
scheme this daemon does not know (`RecordFormatError`). Where the documents
are kept, and their keys, is `sidecar.storage.records`.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Callable
from typing import Any, TypeVar

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

RECORD_VERSION = 1

E = TypeVar("E", bound=enum.Enum)


def _decoder(kind: type[E]) -> Callable[[str], E]:
    """The member of `kind` a stored value names: a dict lookup, where
    calling the enum runs two Python frames per field (a record holds a
    dozen such fields). A value not found falls back to the enum itself,
    which refuses it as before."""
    members = {m.value: m for m in kind}

    def decode(value: str) -> E:
        try:
            return members[value]
        except (KeyError, TypeError):
            return kind(value)

    return decode


_state = _decoder(State)
_event = _decoder(Event)
_effect = _decoder(Effect)
_outcome = _decoder(Outcome)
_channel = _decoder(Channel)
_kind = _decoder(PayloadKind)

# Encoding reads each member's value as `_value_`, the attribute `Enum.value`
# returns through two Python frames (a record's history has three per entry).


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _payload_doc(p: Payload | None) -> dict[str, str] | None:
    return None if p is None else {"kind": p.kind._value_, "data": _b64(p.data)}


def _payload(doc: dict[str, str] | None) -> Payload | None:
    if doc is None:
        return None
    return Payload(_kind(doc["kind"]), base64.b64decode(doc["data"]))


def encode_call(c: ToolCall) -> bytes:
    doc: dict[str, Any] = {
        "v": RECORD_VERSION,
        "ref": [c.ref.namespace, c.ref.run_id, c.ref.call_id],
        "tool": c.tool_name,
        "effect": c.effect._value_,
        "state": c.state._value_,
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
            "outcome": c.result.outcome._value_,
            "payload": _payload_doc(c.result.payload),
            "code": c.result.error_code,
            "message": c.result.error_message,
            "digest": c.result.digest,
        },
        "history": [
            [
                None if t.from_state is None else t.from_state._value_,
                t.to_state._value_,
                t.event._value_,
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
        "channel": c.channel._value_,
        "forced": None if c.forced_effect is None else c.forced_effect._value_,
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


def decode_call(raw: bytes, *, history: bool = True) -> ToolCall:
    """The record of a stored document; keys a later version may add are
    ignored, keys an earlier one lacked take their meaning of then.

    Without `history`, the record's history is left out (empty), which is
    most of the cost of a decode, and so is its kept input: for a reader of
    many records that shows neither (a recovery plan), never for a write. An
    UNKNOWN record keeps its history, since when its outcome became unknown
    may be known only from there.

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
    state = _state(doc["state"])
    transitions = doc["history"] if history or state is State.UNKNOWN else ()
    return ToolCall(
        ref=CallRef(*doc["ref"]),
        tool_name=doc["tool"],
        effect=_effect(doc["effect"]),
        state=state,
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
            _outcome(r["outcome"]),
            _payload(r["payload"]),
            r["code"],
            r["message"],
            r["digest"],
        ),
        history=tuple(
            Transition(
                None if f is None else _state(f),
                _state(t),
                _event(e),
                at,
                actor,
                reason,
                rev,
                att,
            )
            for f, t, e, at, actor, reason, rev, att in transitions
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
        channel=_channel(doc.get("channel", Channel.TOOL.value)),
        forced_effect=None if doc.get("forced") is None else _effect(doc["forced"]),
        # Records written before inputs were kept have no such key.
        kept_input=_payload(doc.get("kept_input")) if history else None,
    )


def _fingerprint_scheme(scheme: int) -> int:
    if scheme not in (FINGERPRINT_V1, FINGERPRINT_V2):
        raise RecordFormatError(f"input fingerprint scheme {scheme!r}")
    return scheme
