"""Bad requests generated from message descriptors, as wire bytes.

For a request type and a base message, `mutations` yields one request per
bad value of every field, nested messages included: Timestamps and
Durations out of range, huge and negative numbers, enum values not defined,
strings of invalid UTF-8 (the wire carries them; the generated classes would
refuse to build them), oversized strings, bytes and repeated fields, and
nested messages that do not parse. Nothing here knows the effectd protos: a
new RPC or field is covered as soon as it is in a descriptor.

A mutation is the base's bytes followed by one more occurrence of the field
on its path: a parser merges a repeated occurrence of a singular message
into the one before and lets the last scalar win, so the request is the base
with only that one field changed. On a repeated message field the
occurrence is a new element, a copy of the base's first element with the
bad value in it.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

T = TypeVar("T")

F = FieldDescriptor
VARINT, I64, LEN, I32 = 0, 1, 2, 5
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
# timestamp.proto: years 1..9999; duration.proto: +-10 000 years.
TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
DURATION_SECONDS = 315_576_000_000
# A string of invalid UTF-8 per way of being invalid.
INVALID_UTF8 = {
    "lone-ff": b"\xff",
    "truncated": b"a\xc3",
    "bad-continuation": b"\xc3\x28",
    "overlong-slash": b"\xc0\xaf",
    "surrogate": b"\xed\xa0\x80",
    "above-10ffff": b"\xf4\x90\x80\x80",
    "stray-continuation": b"a\x80b",
}
# Valid UTF-8 that no identifier, key or text field takes.
CONTROL = {"nul": "a\x00b", "escape": "\x1b[2J", "bell": "\x07"}
# Valid text that many fields take, but that no HTTP header or URL carries:
# sent to the fields of requests that reach HTTP (`http=True`).
NOT_HTTP = {
    "latin1": "café",
    "cjk": "日本",
    "c1-control": "a\x85b",
    "line-separator": "a\u2028b",
    "delete": "a\x7fb",
}
NOT_A_MESSAGE = b"\xff\xff\xff\xff"

_ZIGZAG = {F.TYPE_SINT32, F.TYPE_SINT64}
_FIXED64 = {F.TYPE_FIXED64, F.TYPE_SFIXED64, F.TYPE_DOUBLE}
_FIXED32 = {F.TYPE_FIXED32, F.TYPE_SFIXED32, F.TYPE_FLOAT}
_UNSIGNED = {F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FIXED32, F.TYPE_FIXED64}
_BITS32 = {
    F.TYPE_INT32,
    F.TYPE_UINT32,
    F.TYPE_SINT32,
    F.TYPE_FIXED32,
    F.TYPE_SFIXED32,
    F.TYPE_ENUM,
}


@dataclass(frozen=True, slots=True)
class Depth:
    """How hard to push: sizes of oversized values and how many values of
    each kind per field (0: all of them)."""

    oversize_bytes: tuple[int, ...]
    oversize_count: tuple[int, ...]
    values_per_kind: int


@dataclass(frozen=True, slots=True)
class Mutation:
    path: str
    value: str
    data: bytes

    def __str__(self) -> str:
        return f"{self.path} = {self.value}"


# -- encoding -------------------------------------------------------------------


def varint(n: int) -> bytes:
    """A varint; negative numbers as their 64-bit two's complement (10 bytes)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def tag(field: FieldDescriptor, wire_type: int) -> bytes:
    return varint(field.number << 3 | wire_type)


def delimited(field: FieldDescriptor, data: bytes) -> bytes:
    return tag(field, LEN) + varint(len(data)) + data


def scalar(field: FieldDescriptor, value: int | float) -> bytes:
    """One occurrence of a numeric, bool or enum field holding `value`."""
    if field.type in _FIXED64:
        fmt = "<d" if field.type == F.TYPE_DOUBLE else "<q"
        if field.type == F.TYPE_FIXED64:
            fmt = "<Q"
        return tag(field, I64) + struct.pack(fmt, value)
    if field.type in _FIXED32:
        fmt = "<f" if field.type == F.TYPE_FLOAT else "<i"
        if field.type == F.TYPE_FIXED32:
            fmt = "<I"
        return tag(field, I32) + struct.pack(fmt, value)
    n = int(value)
    if field.type in _ZIGZAG:
        n = (n << 1) ^ (n >> 63)
    return tag(field, VARINT) + varint(n)


# -- the bad values of one field ------------------------------------------------


def _numbers(field: FieldDescriptor) -> dict[str, int | float]:
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
    if field.type == F.TYPE_BOOL:
        return {}
    if field.type == F.TYPE_ENUM:
        assert field.enum_type is not None
        top = max(v.number for v in field.enum_type.values)
        return {"undefined": top + 1, "int32-max": INT32[1], "minus-one": -1}
    low, high = INT32 if field.type in _BITS32 else INT64
    if field.type in _UNSIGNED:
        # What a client of a signed language sends: -1 reads as the maximum.
        return {"max": (high << 1) | 1, "minus-one": -1}
    return {"max": high, "min": low, "minus-one": -1}


def _times(field: FieldDescriptor) -> dict[str, tuple[int, int]]:
    assert field.message_type is not None
    name = field.message_type.full_name
    if name == "google.protobuf.Timestamp":
        low, high = TIMESTAMP_SECONDS
        return {
            "negative-nanos": (0, -1),
            "nanos-a-second": (0, 1_000_000_000),
            "before-year-1": (low - 1, 0),
            "after-year-9999": (high + 1, 0),
            "int64-min": (INT64[0], 0),
            "int64-max": (INT64[1], INT32[1]),
        }
    if name == "google.protobuf.Duration":
        return {
            "signs-differ": (1, -1),
            "nanos-a-second": (0, 1_000_000_000),
            "over-10000-years": (DURATION_SECONDS + 1, 0),
            "int64-min": (INT64[0], 0),
        }
    return {}


def _texts(depth: Depth, rng: random.Random, http: bool) -> dict[str, bytes]:
    found = _sample(
        {f"invalid-utf8-{k}": v for k, v in INVALID_UTF8.items()}, depth, rng
    ) | _sample({f"control-{k}": v.encode() for k, v in CONTROL.items()}, depth, rng)
    if http:
        found |= _sample(
            {f"not-http-{k}": v.encode() for k, v in NOT_HTTP.items()}, depth, rng
        )
    for size in depth.oversize_bytes:
        # Over the limit in bytes: ASCII, or two-byte characters (the
        # limit counts bytes, not characters); one of them unless deep.
        kinds = {
            "ascii": b"x" * size,
            "multibyte": "é".encode() * (size // 2 + 1),
        }
        if depth.values_per_kind:
            picked = rng.choice(sorted(kinds))
            kinds = {picked: kinds[picked]}
        found |= {f"oversized-{size}-{k}": v for k, v in kinds.items()}
    return found


def _sample(found: dict[str, T], depth: Depth, rng: random.Random) -> dict[str, T]:
    """All of `found`, or `values_per_kind` of them picked by `rng`."""
    if not depth.values_per_kind or len(found) <= depth.values_per_kind:
        return found
    keys = rng.sample(sorted(found), depth.values_per_kind)
    return {k: found[k] for k in sorted(keys)}


def bad_values(
    field: FieldDescriptor,
    template: bytes,
    depth: Depth,
    rng: random.Random,
    *,
    http: bool = False,
) -> dict[str, bytes]:
    """Label -> one occurrence of `field` (its tag included) holding a bad
    value; `template` is a valid element of it (for oversized repeats). With
    `http`, a string field also gets text HTTP cannot carry (`NOT_HTTP`)."""
    found: dict[str, bytes] = {}
    if field.type == F.TYPE_STRING:
        texts = _texts(depth, rng, http)
        found = {k: delimited(field, v) for k, v in texts.items()}
    elif field.type == F.TYPE_BYTES:
        found = {
            f"oversized-{size}": delimited(field, b"\x00" * size)
            for size in depth.oversize_bytes
        }
    elif field.type == F.TYPE_MESSAGE:
        found = {"not-a-message": delimited(field, NOT_A_MESSAGE)}
        for label, (seconds, nanos) in _times(field).items():
            body = varint(1 << 3 | VARINT) + varint(seconds)
            body += varint(2 << 3 | VARINT) + varint(nanos)
            found[label] = delimited(field, body)
    else:
        numbers = {k: scalar(field, v) for k, v in _numbers(field).items()}
        found = _sample(numbers, depth, rng)
    if field.is_repeated:
        for count in depth.oversize_count:
            found[f"{count}-elements"] = template * count
    return found


# -- walking a request ----------------------------------------------------------


def _element(field: FieldDescriptor, base: Message) -> Message | None:
    """The base's value of a message field: its first element if repeated."""
    if field.is_repeated:
        values = getattr(base, field.name)
        return values[0] if len(values) else None
    return getattr(base, field.name) if base.HasField(field.name) else None


def _template(field: FieldDescriptor, base: Message) -> bytes:
    """One valid occurrence of `field`: the base's, else a default."""
    if field.type == F.TYPE_MESSAGE:
        element = _element(field, base)
        return delimited(field, element.SerializeToString() if element else b"")
    if field.type in (F.TYPE_STRING, F.TYPE_BYTES):
        return delimited(field, b"x")
    return scalar(field, 1)


def mutations(
    descriptor: Descriptor,
    base: Message,
    depth: Depth,
    rng: random.Random,
    *,
    prefix: str = "",
    seen: tuple[str, ...] = (),
    http: bool = False,
) -> Iterator[Mutation]:
    """Every bad value of every field of `descriptor`, nested fields
    included (each message type once per path, so recursion ends); the
    `data` of each is an occurrence of the whole message, to append to the
    bytes of `base`'s parent (or to `base` itself at the top). `http`: the
    message reaches HTTP (`bad_values`)."""
    for field in descriptor.fields:
        path = f"{prefix}{field.name}{'[+]' if field.is_repeated else ''}"
        template = _template(field, base)
        found = bad_values(field, template, depth, rng, http=http)
        for label, data in found.items():
            yield Mutation(path, label, data)
        nested = field.message_type
        if (
            nested is None
            or nested.full_name in seen
            or nested.full_name.startswith("google.protobuf.")
        ):
            continue
        element = _element(field, base)
        inner_base = element if element is not None else _empty(nested)
        head = inner_base.SerializeToString() if field.is_repeated else b""
        for inner in mutations(
            nested,
            inner_base,
            depth,
            rng,
            prefix=path + ".",
            seen=(*seen, descriptor.full_name),
            http=http,
        ):
            yield Mutation(inner.path, inner.value, delimited(field, head + inner.data))


def _empty(descriptor: Descriptor) -> Message:
    return GetMessageClass(descriptor)()


def filled(descriptor: Descriptor, seen: tuple[str, ...] = ()) -> Message:
    """A message with a plausible value in every field (the first member of
    each oneof): "x", 1, the first defined enum value, one element of each
    repeated field. Often still invalid, but further from empty."""
    msg = _empty(descriptor)
    chosen: set[str] = set()
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and len(oneof.fields) > 1:
            if oneof.name in chosen:
                continue
            chosen.add(oneof.name)
        nested = field.message_type
        if nested is not None:
            if nested.full_name in seen:
                continue
            if nested.full_name.startswith("google.protobuf."):
                value = _empty(nested)
                if "seconds" in nested.fields_by_name:
                    value.seconds = 1  # type: ignore[attr-defined]
            else:
                value = filled(nested, (*seen, descriptor.full_name))
            if field.is_repeated:
                getattr(msg, field.name).add().CopyFrom(value)
            else:
                getattr(msg, field.name).CopyFrom(value)
            continue
        plain = _plain(field)
        if field.is_repeated:
            getattr(msg, field.name).append(plain)
        else:
            setattr(msg, field.name, plain)
    return msg


def _plain(field: FieldDescriptor) -> object:
    if field.type == F.TYPE_STRING:
        return "x"
    if field.type == F.TYPE_BYTES:
        return b"x"
    if field.type == F.TYPE_BOOL:
        return True
    if field.type == F.TYPE_ENUM:
        assert field.enum_type is not None
        numbers = [v.number for v in field.enum_type.values if v.number]
        return numbers[0] if numbers else 0
    return 1


def requests(
    base: Message, depth: Depth, rng: random.Random, *, http: bool = False
) -> Iterator[tuple[Mutation, bytes]]:
    """Each mutation of `base` with the whole request's bytes; `http`: the
    request reaches HTTP (`bad_values`)."""
    head = base.SerializeToString()
    descriptor: Any = base.DESCRIPTOR
    for m in mutations(descriptor, base, depth, rng, http=http):
        yield m, head + m.data
