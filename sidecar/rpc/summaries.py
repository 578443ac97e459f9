"""The wire form a plan row keeps (`storage.plan_rows`): a record without
its history, serialized as the boundary answers it (`convert.call_pb`), and
where its result and its idempotency key lie in it, which a Recover answer
frames as they are (`rpc.recovery`). The daemon hands `summarize` to its
store when it opens it, so storage keeps these bytes without knowing the
wire form."""

from __future__ import annotations

from effectd.v1 import ledger_pb2 as pb

from sidecar.ledger.model import ToolCall
from sidecar.rpc import convert

_KEY = pb.ToolCall.IDEMPOTENCY_KEY_FIELD_NUMBER
_RESULT = pb.ToolCall.RESULT_FIELD_NUMBER
# Wire types: varint, 64-bit, length-delimited, 32-bit.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at `at`, and where it ends."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _value_spans(data: bytes, wanted: frozenset[int]) -> dict[int, tuple[int, int]]:
    """The offset and size of the value (after the tag) of each top-level
    field of `data` in `wanted`; a field not set is not there."""
    spans: dict[int, tuple[int, int]] = {}
    at, end, last = 0, len(data), max(wanted)
    while at < end:
        tag, start = _varint(data, at)
        field, wire = tag >> 3, tag & 7
        if field > last:  # fields are written in number order
            break
        if wire == _LEN:
            size, body = _varint(data, start)
            at = body + size
        elif wire == _VARINT:
            _, at = _varint(data, start)
        else:
            at = start + (8 if wire == _I64 else 4)
        if field in wanted:
            spans[field] = (start, at - start)
    return spans


_WANTED = frozenset({_KEY, _RESULT})


def summarize(call: ToolCall) -> tuple[bytes, int, int, int, int]:
    """The `storage.plan_rows.Summary` of `call`: its `ToolCall` without
    history, the offset and size of its result's value in it, and those of
    its idempotency key's (0, 0 when it has none).

    Raises:
        UnicodeError: text the wire form cannot carry (not UTF-8).
    """
    data = convert.call_pb(call, history=False).SerializeToString()
    spans = _value_spans(data, _WANTED)
    result_at, result_size = spans[_RESULT]
    key_at, key_size = spans.get(_KEY, (0, 0))
    return data, result_at, result_size, key_at, key_size
