"""The plan row of a COMMITTED record: what a recovery plan shows of the
call, stored beside the record so that a plan is assembled from bytes.

A recovery plan (`ledger.recovery`) shows each call without its history.
Decoding a stored JSON record and building its answer field by field costs
tens of microseconds a call; for a COMMITTED record, whose item recovery
never changes (nothing settles or enforces on it), that work is done once,
when the record is saved. `Table.PLAN_ROWS` maps a record key to:

    a head (`_HEAD`): the row version, flags (acknowledged, rejected), the
        declared and forced effects, and the lengths of the tool name, of
        the summary, and where the result and the idempotency key lie in it
        (each as its length and bytes: its field without the tag byte);
    the tool name (UTF-8), which the policy's effect depends on;
    the summary: the record without its history in the protobuf wire form
        of `effectd.v1.ToolCall` (fields in number order, as the protobuf
        runtime writes them), so an answer carries it as it is.

The summary is the storage's own derived form of the record, kept by
`records.save_call` in the record's transaction (and deleted with it by
`tombstones.compact`), like the by-state and retention indexes: written
only for a COMMITTED record with a result, deleted when the record is not
one. Its enum numbers are those of `effectd.v1`; a test holds every row
byte for byte to what the gRPC boundary would build from the decoded
record, on random records, so any drift between the two fails there. A
record with no row, or a row of another version, is read the long way.
"""

from __future__ import annotations

import struct

from sidecar.ledger.model import (
    KEY_SCHEMES,
    Approval,
    Channel,
    Effect,
    Outcome,
    Payload,
    PayloadKind,
    Reconciliation,
    Resolution,
    Result,
    State,
    ToolCall,
)

VERSION = 1
ACKNOWLEDGED = 1
REJECTED = 2
# version, flags, effect, forced effect (0: none), tool name length, summary
# length, and the offsets and lengths within the summary of the result and
# of the idempotency key, each as a length-delimited value (its length, then
# its bytes) with no tag.
_HEAD = struct.Struct(">BBBBHIIIII")
HEAD_SIZE = _HEAD.size

# The numbers of `effectd.v1` (ledger.proto).
_EFFECTS = {Effect.READ: 1, Effect.IDEMPOTENT_WRITE: 2, Effect.SIDE_EFFECT: 3}
_EFFECT_OF_CODE = {code: effect for effect, code in _EFFECTS.items()}
_STATES = {
    State.PREPARED: 1,
    State.AWAITING_APPROVAL: 2,
    State.STARTED: 3,
    State.UNKNOWN: 4,
    State.COMMITTED: 5,
}
_OUTCOMES = {Outcome.OK: 1, Outcome.ERROR: 2}
_CHANNELS = {
    Channel.TOOL: 1,
    Channel.MCP: 2,
    Channel.CHILD_FOREGROUND: 3,
    Channel.DURABLE_BACKGROUND: 4,
}
_RESOLUTIONS = {Resolution.COMMITTED: 1, Resolution.NOT_EXECUTED: 2}
_NANOS = 1_000_000_000


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 fields: ten bytes of two's complement
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _scalar(field: int, value: int) -> bytes:
    """A varint field; proto3 leaves a zero out."""
    return _tag(field, 0) + _varint(value) if value else b""


def _bytes(field: int, data: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(data)) + data if data else b""


def _text(field: int, value: str) -> bytes:
    # Strict UTF-8: a string protobuf could not carry raises, and the record
    # gets no row (`encode`).
    return _bytes(field, value.encode())


def _message(field: int, body: bytes) -> bytes:
    """A set message field: written even when empty."""
    return _tag(field, 2) + _varint(len(body)) + body


def _timestamp(field: int, ns: int) -> bytes:
    seconds, nanos = divmod(ns, _NANOS)
    return _message(field, _scalar(1, seconds) + _scalar(2, nanos))


def _payload(p: Payload) -> bytes:
    # A oneof member is written when set, even empty.
    if p.kind is PayloadKind.JSON:
        p.data.decode()  # strict: as the boundary would need it
        return _tag(1, 2) + _varint(len(p.data)) + p.data
    return _tag(2, 2) + _varint(len(p.data)) + p.data


def _result(r: Result) -> bytes:
    return (
        _scalar(1, _OUTCOMES[r.outcome])
        + (b"" if r.payload is None else _message(2, _payload(r.payload)))
        + _text(3, r.error_code)
        + _text(4, r.error_message)
        + _text(5, r.digest)
    )


def _approval(a: Approval) -> bytes:
    return (
        _scalar(1, a.approved)
        + _text(2, a.approver)
        + _text(3, a.reason)
        + _timestamp(4, a.at_ns)
        + _text(5, a.input_fingerprint)
        + _scalar(6, a.revision)
    )


def _reconciliation(r: Reconciliation) -> bytes:
    return (
        _scalar(1, _RESOLUTIONS[r.resolution])
        + _text(2, r.operator)
        + _text(3, r.reason)
        + _text(4, r.evidence)
        + _timestamp(5, r.at_ns)
        + _scalar(6, _STATES[r.from_state])
        + _scalar(7, r.revision)
        + _scalar(8, r.attempt)
    )


def encode(call: ToolCall) -> bytes | None:
    """The plan row of `call`; None when it gets none: not COMMITTED, no
    result, a key scheme this daemon does not know, or text that is not
    UTF-8 (such a record is read the long way)."""
    result = call.result
    if (
        call.state is not State.COMMITTED
        or result is None
        or call.key_scheme not in KEY_SCHEMES
    ):
        return None
    try:
        return _encode(call, result)
    except UnicodeError:
        return None


def _encode(call: ToolCall, result: Result) -> bytes:
    ref = call.ref
    key = call.idempotency_key.encode()
    head = (
        _message(
            1, _text(1, ref.namespace) + _text(2, ref.run_id) + _text(3, ref.call_id)
        )
        + _text(2, call.tool_name)
        + _scalar(3, _EFFECTS[call.effect])
        + _scalar(4, _STATES[call.state])
        + _scalar(5, call.revision)
    )
    key_field = _bytes(6, key)
    key_at = len(head) + 1  # after the tag (one byte for fields 1 to 15)
    head += (
        key_field
        + _scalar(7, call.key_scheme)
        + _text(8, call.input_fingerprint)
        + _scalar(9, call.approval_required)
        + _scalar(10, call.attempt)
    )
    if call.lease is not None:
        head += _timestamp(11, call.lease.expires_wall_ns)
    body = _result(result)
    result_field = _message(12, body)
    result_at = len(head) + 1
    summary = (
        head
        + result_field
        + _scalar(13, call.acknowledged)
        + _timestamp(14, call.created_ns)
        + _timestamp(15, call.updated_ns)
        + (b"" if call.approval is None else _message(17, _approval(call.approval)))
        + b"".join(_message(18, _reconciliation(r)) for r in call.reconciliations)
        + _scalar(40, _CHANNELS[call.channel])
        + (
            b""
            if call.forced_effect is None
            else _scalar(42, _EFFECTS[call.forced_effect])
        )
    )
    tool = call.tool_name.encode()
    flags = (ACKNOWLEDGED if call.acknowledged else 0) | (
        REJECTED if call.rejected else 0
    )
    return (
        _HEAD.pack(
            VERSION,
            flags,
            _EFFECTS[call.effect],
            0 if call.forced_effect is None else _EFFECTS[call.forced_effect],
            len(tool),
            len(summary),
            result_at,
            len(result_field) - 1,
            key_at,
            len(key_field) - 1 if key_field else 0,
        )
        + tool
        + summary
    )


def is_current(raw: bytes) -> bool:
    """Whether a row is of this version (`parts` reads only those)."""
    return raw[0] == VERSION


def parts(raw: bytes) -> tuple[int, int, str, bytes, bytes, bytes]:
    """A row's flags; the code of the effect the record itself assumes (the
    forced one, else as declared; `effect_of_code`); its tool name; its
    summary; and, as they lie in it, its result and its idempotency key,
    each as its length and bytes."""
    (
        _,
        flags,
        effect,
        forced,
        tool_size,
        summary_size,
        result_at,
        result_size,
        key_at,
        key_size,
    ) = _HEAD.unpack_from(raw)
    start = HEAD_SIZE + tool_size
    summary = raw[start : start + summary_size]
    return (
        flags,
        forced or effect,
        raw[HEAD_SIZE:start].decode(),
        summary,
        summary[result_at : result_at + result_size],
        summary[key_at : key_at + key_size],
    )


def effect_of_code(code: int) -> Effect:
    return _EFFECT_OF_CODE[code]
