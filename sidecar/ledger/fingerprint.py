"""Input fingerprints and result digests (contract §3.3).

JSON is canonicalized with RFC 8785 first, so the same logical input from
Python, Node or a retry with reordered keys has one fingerprint. Opaque bytes
are hashed as sent. JSON that RFC 8785 cannot represent exactly (NaN,
integers beyond 2**53, duplicate keys) is refused rather than hashed loosely.

The input's kind is hashed before its bytes (scheme V2), so a JSON input and
a raw one never share a fingerprint (JSON `1.0` and raw `1` did, in V1).
Records stored before V2 keep their V1 fingerprint, and are compared with a
repeated prepare in V1 (`of`): their inputs are gone, only the hash is kept.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import rfc8785

from sidecar.ledger.model import (
    FINGERPRINT_V1,
    FINGERPRINT_V2,
    Outcome,
    Payload,
    PayloadKind,
)


class NotCanonicalizable(ValueError):
    """JSON text that has no single RFC 8785 form."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise NotCanonicalizable("duplicate object key")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise NotCanonicalizable(f"{name} is not JSON")


class _NotPlain(Exception):
    """The value has a number `_plain` does not serialize as RFC 8785 does."""


def _no_float(text: str) -> Any:
    raise _NotPlain


# Sixteen digits in a row: an integer that may lie beyond 2**53 - 1 (every
# integer of fifteen digits or fewer lies within it), or a long string.
_LONG_DIGITS = re.compile(rb"[0-9]{16}")
# Below the surrogates: a text of only these characters has no lone
# surrogate, and its keys sort alike by code point and by UTF-16 code unit.
_BELOW_SURROGATES = "\ud800"


def _plain(text: str) -> bytes | None:
    """The RFC 8785 form of JSON text whose numbers are all integers within
    +-(2**53 - 1) and whose characters all lie below U+D800, by the
    standard library's JSON encoder (sorted keys, no spaces, no ASCII
    escaping): for such values its output is RFC 8785's, byte for byte
    (integers in decimal, the same string escapes, keys in the same
    order). None for any other value (the caller then serializes it with
    `rfc8785`, which also refuses what has no RFC 8785 form)."""
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_float=_no_float,
        )
    except _NotPlain:
        return None
    out = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if not out.isascii() and max(out) >= _BELOW_SURROGATES:
        return None
    return out.encode("utf-8")


def canonical_json(text: bytes) -> bytes:
    """The RFC 8785 form of JSON text.

    Most inputs (no fractions or exponents, no integer of sixteen digits or
    more, no character from U+D800 on) are serialized by the standard
    library's encoder in C (`_plain`), the rest by `rfc8785`; the two agree
    wherever the first is used (tests/ledger/test_fingerprint.py compares
    them on random values).

    Raises:
        NotCanonicalizable: the text is not JSON, or not representable.
    """
    try:
        decoded = text.decode("utf-8")
        if _LONG_DIGITS.search(text) is None:
            plain = _plain(decoded)
            if plain is not None:
                return plain
        value = json.loads(
            decoded,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
        return rfc8785.dumps(value)
    except NotCanonicalizable:
        raise
    except (ValueError, RecursionError, rfc8785.CanonicalizationError) as exc:
        raise NotCanonicalizable(str(exc) or type(exc).__name__) from exc


def _canonical_bytes(payload: Payload) -> bytes:
    if payload.kind is PayloadKind.JSON:
        return canonical_json(payload.data)
    return payload.data


# Ends with NUL, which no kind name holds: the tag and the input never blur.
_KIND_TAGS = {
    kind: b"effectd.input." + kind.value.encode() + b"\x00" for kind in PayloadKind
}


def fingerprint(payload: Payload, canonical: bytes | None = None) -> str:
    """`sha256:<hex>` of the input's kind and canonical bytes (scheme V2);
    `canonical`: those bytes (JSON in its RFC 8785 form, raw bytes as sent),
    when the caller has them already, so a payload is canonicalized once."""
    if canonical is None:
        canonical = _canonical_bytes(payload)
    data = _KIND_TAGS[payload.kind] + canonical
    return "sha256:" + hashlib.sha256(data).hexdigest()


def of(payload: Payload, scheme: int) -> str:
    """The fingerprint of `payload` in `scheme`: V2, or V1 (the canonical
    bytes alone) to compare with a record stored before V2.

    Raises:
        ValueError: a scheme this daemon does not know.
    """
    if scheme == FINGERPRINT_V2:
        return fingerprint(payload)
    if scheme == FINGERPRINT_V1:
        return "sha256:" + hashlib.sha256(_canonical_bytes(payload)).hexdigest()
    raise ValueError(f"input fingerprint scheme {scheme}")


def result_digest(
    outcome: Outcome,
    payload: Payload | None,
    error_code: str,
    error_message: str,
    canonical: bytes | None = None,
) -> str:
    """`sha256:<hex>` over everything a committed result says; `canonical`:
    the payload's canonical bytes, when the caller has them already."""
    if payload is not None and canonical is None:
        canonical = _canonical_bytes(payload)
    h = hashlib.sha256()
    for part in (
        outcome.value.encode(),
        b"" if payload is None else payload.kind.value.encode(),
        b"" if canonical is None else canonical,
        error_code.encode(),
        error_message.encode(),
    ):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return "sha256:" + h.hexdigest()
