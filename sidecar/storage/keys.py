"""How identities become store keys that always fit LMDB's key limit.

An identity part (a run_id, a call_id, a checkpoint key) is stored verbatim
up to a bound, and longer ones as their first bytes, a marker byte and the
hex SHA-256 of the whole part. Keys stay in readable order for what is short
and the first bytes of what is long; the readable identity of a long part is
kept in the value (the record's `ref`, the checkpoint's key). The marker is a
control character, which validation refuses in every identifier
(`ledger.validation`), so a verbatim part and a hashed part never collide,
and the marker, like the hex digits, is never the NUL that separates parts.

With the bounds below, the longest key of each table, for every size that
validation accepts (a 64-byte namespace, 256-byte run_id and call_id,
512-byte checkpoint key), is shorter than `MAX_KEY_BYTES`:
`tests/storage/test_keys.py` measures it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sidecar.ledger.model import CallRef

# LMDB's key limit as built (MDB_MAXKEYSIZE; `lmdb.Environment.max_key_size`).
MAX_KEY_BYTES = 511
HASHED = b"\x01"
_DIGEST_BYTES = 64  # hex SHA-256


@dataclass(frozen=True, slots=True)
class PartBound:
    """A part of at most `verbatim` bytes is stored as it is; a longer one
    as its first `kept` bytes, the marker and its digest."""

    verbatim: int
    kept: int

    def __post_init__(self) -> None:
        if self.kept + 1 + _DIGEST_BYTES > self.verbatim:
            raise ValueError("a hashed part must not be longer than a verbatim one")


# namespace (64) NUL run (200) NUL call (200), plus the by-state index's
# state byte: 467 bytes at most.
CALL_PART = PartBound(verbatim=200, kept=128)
# namespace (64) NUL key (440): 505 bytes at most.
CHECKPOINT_KEY = PartBound(verbatim=440, kept=256)


def part(value: str, bound: PartBound) -> bytes:
    """The stored form of one identity part."""
    data = value.encode()
    if len(data) <= bound.verbatim:
        return data
    digest = hashlib.sha256(data).hexdigest().encode()
    return data[: bound.kept] + HASHED + digest


def is_hashed(stored: bytes) -> bool:
    """Whether a stored key holds a hashed part (its identity is in the value)."""
    return HASHED in stored


class KeyTooLong(ValueError):
    """A write function wrote a key longer than a store keeps. Keys are built
    to fit (`part`); raised inside the function, it refuses that request
    alone, never its batch. Every store refuses the same keys."""


def check_key(key: bytes) -> None:
    """Raises KeyTooLong for a key longer than `MAX_KEY_BYTES`."""
    if len(key) > MAX_KEY_BYTES:
        raise KeyTooLong(
            f"a store key has {len(key)} bytes, the store keeps {MAX_KEY_BYTES}"
        )


# -- where the ledger's identities are: keys, and the prefixes of walks ------------

_SEP = b"\x00"


def namespace_prefix(namespace: str) -> bytes:
    return namespace.encode() + _SEP


def run_prefix(namespace: str, run_id: str) -> bytes:
    return namespace_prefix(namespace) + part(run_id, CALL_PART) + _SEP


def call_key(ref: CallRef) -> bytes:
    return run_prefix(ref.namespace, ref.run_id) + part(ref.call_id, CALL_PART)


def namespace_of(key: bytes) -> str:
    """The namespace of a key of CALLS, TOMBSTONES or CHECKPOINTS (of
    CALL_STATES without its state byte)."""
    return key.split(_SEP, 1)[0].decode()


def checkpoint_key(namespace: str, key: str) -> bytes:
    return namespace_prefix(namespace) + part(key, CHECKPOINT_KEY)


def checkpoint_ranges(namespace: str, prefix: str) -> list[bytes]:
    """The key ranges, in key order, that hold every checkpoint of
    `namespace` whose key starts with `prefix` (and may hold others).

    A key stored verbatim starts with the prefix itself. A key stored hashed
    starts with its first `kept` bytes: with a prefix no longer than those,
    the same range holds it; with a longer one, it is in the range of the
    prefix's first `kept` bytes and the marker, which sorts first."""
    base = namespace_prefix(namespace)
    data = prefix.encode()
    kept = CHECKPOINT_KEY.kept
    if len(data) <= kept:
        return [base + data]
    return [base + data[:kept] + HASHED, base + data]
