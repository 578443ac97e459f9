"""Hypothesis strategies for requests, built by walking message descriptors.

`message_bytes(descriptor)` draws a whole request as wire bytes: every field
may be absent, present once, or (on the wire) present again; numbers span
their type and its edges; enums take defined and undefined values; strings
are drawn from a pool of plausible values (so that requests reach the
records a test seeded), from arbitrary text, from text with control
characters, from oversized text, or are invalid UTF-8 (the generated classes
would refuse to build it, the wire carries it); bytes likewise; nested
messages recurse to a bounded depth; repeated fields and maps (repeated
entry messages on the wire) get a few elements; a oneof may get none, one or
several of its members (the parser keeps the last). Nothing here knows the
effectd protos beyond the names in the pools: a new RPC or field is fuzzed
as soon as it is in a descriptor.

`mangled(data)` draws raw bytes around a request: flipped bytes, truncations,
random bytes appended or alone; `mutant(rng, data)` makes one such variant
without Hypothesis, cheaply, so that each drawn request is sent again as a
few mutants (drawing a structured request costs far more than sending it).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from tests.rpc import wire

F = FieldDescriptor
# How deep nested messages go before a message field is left out.
MAX_DEPTH = 3
MAX_REPEATED = 4
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT32 = (0, (1 << 32) - 1)
UINT64 = (0, (1 << 64) - 1)
_SIGNED32 = {F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32}
_SIGNED64 = {F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64}
_UNSIGNED32 = {F.TYPE_UINT32, F.TYPE_FIXED32}
_UNSIGNED64 = {F.TYPE_UINT64, F.TYPE_FIXED64}

# Values that pass validation and name what a test seeded, by field name;
# `GENERIC` for the other string fields.
Pools = Mapping[str, tuple[str, ...]]
# Strings past the size limits of the contract: a 257-byte identity, a
# 258-byte one of 129 characters, a 65-character namespace, a 4097-byte
# message, a 513-byte checkpoint key.
OVERSIZED = ("x" * 257, "é" * 129, "n" * 65, "m" * 4097, "k" * 513)
# Past the 1 MiB payload limit, in the fields that carry payloads: drawn
# once in `HUGE_ODDS` (a request of a megabyte is slow to send).
HUGE = (b'"' + b"a" * (1 << 20) + b'"', b"\x00" * ((1 << 20) + 1))
HUGE_ODDS = 64
PAYLOADS = frozenset({"json", "raw", "value", "body", "kept_input"})
CONTROL = ("a\x00b", "\x1b[2J", "a\nb", "\x7f", "a\x85b", "a:b", "a/b", "..", "\u2028")


def _edges(low: int, high: int) -> st.SearchStrategy[int]:
    """Small numbers (revisions, attempts), the type's edges, or any."""
    edges = {low, high, -1, 0, 1 << 31, 1 << 32, 1 << 53}
    return st.one_of(
        st.integers(0, 8),
        st.sampled_from(sorted(n for n in edges if low <= n <= high)),
        st.integers(low, high),
    )


def _last0(number: int) -> tuple[bool, int]:
    return (number == 0, number)


def _number(field: FieldDescriptor, hostile: bool) -> st.SearchStrategy[bytes]:
    """One occurrence of a numeric, bool or enum field; not `hostile`: a
    small number, a defined enum value."""
    kind = field.type
    # Hypothesis leans to the first choice and to 0: plausible values put
    # the ones that pass first (an UNSPECIFIED enum or a 0 attempt rarely do).
    if not hostile:
        if kind == F.TYPE_ENUM:
            assert field.enum_type is not None
            defined = sorted((v.number for v in field.enum_type.values), key=_last0)
            return st.sampled_from(defined).map(lambda v: wire.scalar(field, v))
        low, top = (0, 1) if kind == F.TYPE_BOOL else (1, 4)
        return st.integers(low, top).map(lambda v: wire.scalar(field, v))
    if kind in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.floats(width=64 if kind == F.TYPE_DOUBLE else 32).map(
            lambda v: wire.scalar(field, v)
        )
    if kind == F.TYPE_BOOL:
        # A bool is a varint on the wire: 2 and 2**64-1 read as true.
        values = st.one_of(st.sampled_from([0, 1]), _edges(*UINT64))
        return values.map(lambda v: wire.tag(field, wire.VARINT) + wire.varint(v))
    if kind == F.TYPE_ENUM:
        assert field.enum_type is not None
        defined = [v.number for v in field.enum_type.values]
        values = st.one_of(st.sampled_from(defined), _edges(*INT32))
        return values.map(lambda v: wire.scalar(field, v))
    if kind in _SIGNED32:
        bounds = INT32
    elif kind in _SIGNED64:
        bounds = INT64
    elif kind in _UNSIGNED32:
        bounds = UINT32
    else:
        assert kind in _UNSIGNED64, field.full_name
        bounds = UINT64
    return _edges(*bounds).map(lambda v: wire.scalar(field, v))


def _text(
    field: FieldDescriptor, pools: Pools, hostile: bool
) -> st.SearchStrategy[bytes]:
    """The bytes of one string or bytes field's value; not `hostile`: one of
    its pool."""
    pool = pools.get(field.full_name) or pools.get(field.name) or pools["GENERIC"]
    if not hostile:
        return st.sampled_from(pool).map(lambda s: s.encode())
    plain = st.one_of(
        st.sampled_from(pool),
        st.sampled_from(pool),
        st.text(max_size=24),
        st.sampled_from(CONTROL),
        st.sampled_from(OVERSIZED),
        st.just(""),
    ).map(lambda s: s.encode())
    if field.type == F.TYPE_BYTES:
        drawn = st.one_of(plain, st.binary(max_size=64))
    else:
        invalid = st.sampled_from(sorted(wire.INVALID_UTF8.values()))
        drawn = st.one_of(plain, plain, invalid, st.binary(max_size=16))
    if field.name not in PAYLOADS:
        return drawn
    huge = st.sampled_from(HUGE)
    return st.integers(1, HUGE_ODDS).flatmap(lambda n: huge if n == 1 else drawn)


def _occurrence(
    field: FieldDescriptor, pools: Pools, depth: int, hostile: bool
) -> st.SearchStrategy[bytes] | None:
    """One occurrence of `field` on the wire; None for a message field past
    the depth limit."""
    if field.type == F.TYPE_MESSAGE:
        if depth >= MAX_DEPTH:
            return None
        nested = field.message_type
        assert nested is not None
        inner = st.deferred(lambda: message_bytes(nested, pools, depth + 1, hostile))
        if hostile:
            inner = st.one_of(inner, st.just(wire.NOT_A_MESSAGE))
        return inner.map(lambda data: wire.delimited(field, data))
    if field.type in (F.TYPE_STRING, F.TYPE_BYTES):
        drawn = _text(field, pools, hostile)
        return drawn.map(lambda data: wire.delimited(field, data))
    return _number(field, hostile)


def _field(
    field: FieldDescriptor, pools: Pools, depth: int, hostile: bool
) -> st.SearchStrategy[bytes]:
    one = _occurrence(field, pools, depth, hostile)
    if one is None:
        return st.just(b"")
    if field.is_repeated:
        least = 0 if hostile else 1
        return st.lists(one, min_size=least, max_size=MAX_REPEATED).map(b"".join)
    if not hostile:  # there, once
        return one
    # Mostly once; sometimes twice (merged, or the last wins).
    return st.one_of(st.just(b""), one, one, st.tuples(one, one).map(b"".join))


def _oneof(
    fields: list[FieldDescriptor], pools: Pools, depth: int, hostile: bool
) -> Any:
    """None or one member of a oneof, sometimes two (the parser keeps the
    last)."""
    members = [_field(f, pools, depth, hostile) for f in fields]
    one = st.sampled_from(members).flatmap(lambda member: member)
    if not hostile:
        return one
    return st.one_of(st.just(b""), one, one, st.tuples(one, one).map(b"".join))


def message_bytes(
    descriptor: Descriptor, pools: Pools, depth: int = 0, hostile: bool = True
) -> st.SearchStrategy[bytes]:
    """A message of `descriptor` as wire bytes, its fields in order or
    backwards; not `hostile`: every value plausible (pools, small numbers,
    defined enums), so that the request reaches the rules."""
    parts = [
        _field(f, pools, depth, hostile)
        for f in descriptor.fields
        if f.containing_oneof is None or (f.has_presence and _synthetic(f))
    ]
    parts += [
        _oneof(list(o.fields), pools, depth, hostile)
        for o in descriptor.oneofs
        if not _synthetic(o.fields[0])
    ]
    if not parts:
        return st.just(b"")
    # In their order, or backwards (a parser must not care).
    return st.tuples(st.booleans(), st.tuples(*parts)).map(
        lambda found: b"".join(found[1][:: -1 if found[0] else 1])
    )


def _synthetic(field: FieldDescriptor) -> bool:
    """A proto3 `optional` field (its oneof is synthetic, of one member)."""
    oneof = field.containing_oneof
    return oneof is not None and len(oneof.fields) == 1 and oneof.name.startswith("_")


def mangled(data: bytes) -> st.SearchStrategy[bytes]:
    """Raw bytes made from `data`: a byte flipped, cut short, random bytes
    appended, or random bytes alone."""

    def flip(at: int, value: int) -> bytes:
        if not data:
            return bytes([value])
        i = at % len(data)
        return data[:i] + bytes([value]) + data[i + 1 :]

    return st.one_of(
        st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)).map(lambda p: flip(*p)),
        st.integers(0, max(0, len(data) - 1)).map(lambda n: data[:n]),
        st.binary(min_size=1, max_size=16).map(lambda tail: data + tail),
        st.binary(max_size=64),
    )


def requests(
    descriptor: Descriptor, pools: Pools
) -> st.SearchStrategy[tuple[str, bytes]]:
    """A request of `descriptor`, with how it was drawn: "plausible",
    "one-bad" (plausible but for one field), "hostile" (every field), or
    "raw" (bytes mangled from a hostile one)."""
    plausible = message_bytes(descriptor, pools, hostile=False)
    hostile = message_bytes(descriptor, pools)
    # A plausible request with one field drawn hostile after it: the parser
    # lets the last scalar win and merges a message into the one before, so
    # the request is plausible but for that field (and reaches its check).
    fields = list(descriptor.fields)
    one_bad = plausible
    if fields:
        bad = st.sampled_from(fields).flatmap(lambda f: _field(f, pools, 0, True))
        one_bad = st.tuples(plausible, bad).map(b"".join)
    return st.one_of(
        plausible.map(lambda data: ("plausible", data)),
        one_bad.map(lambda data: ("one-bad", data)),
        one_bad.map(lambda data: ("one-bad", data)),
        hostile.map(lambda data: ("hostile", data)),
        hostile.flatmap(mangled).map(lambda data: ("raw", data)),
    )


def mutant(rng: random.Random, data: bytes, other: bytes = b"") -> bytes:
    """One variant of `data`: a byte changed, a bit flipped, a slice cut,
    doubled or replaced by random bytes, cut short, or spliced with
    `other` (another request of the same kind)."""
    if not data:
        return rng.randbytes(rng.randrange(1, 16))
    at = rng.randrange(len(data))
    end = min(len(data), at + rng.randrange(1, 9))
    head, tail = data[:at], data[at + 1 :]
    variants = (
        lambda: head + bytes([rng.randrange(256)]) + tail,
        lambda: head + bytes([data[at] ^ 1 << rng.randrange(8)]) + tail,
        lambda: head + data[end:],
        lambda: data[:end] + data[at:],
        lambda: head + rng.randbytes(end - at) + data[end:],
        lambda: head,
        lambda: head + other[rng.randrange(len(other) + 1) :],
    )
    return rng.choice(variants)()
