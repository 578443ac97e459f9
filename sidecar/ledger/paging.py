"""Page tokens: the last key of the previous page, opaque to clients.

A token must lie inside the listing it continues (its prefix), so a token
forged or copied from another listing can never reach another namespace.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence

from sidecar.errors import FieldViolation, InvalidArgument


def encode(last_key: bytes) -> str:
    return base64.urlsafe_b64encode(last_key).decode()


def decode(token: str, prefix: bytes) -> bytes | None:
    """The key to continue after, or None for the first page."""
    if not token:
        return None
    try:
        key = base64.urlsafe_b64decode(token.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise _foreign() from None
    if not key or not key.startswith(prefix):
        raise _foreign()
    return key


def decode_across(
    token: str, prefix_of: Callable[[str], bytes], scope: frozenset[str] | None
) -> tuple[str, bytes] | None:
    """For a listing over several namespaces (keys `namespace NUL ...`): the
    namespace the token lies in and the key to continue after, or None for
    the first page. The token must lie inside its namespace's part of the
    listing (`prefix_of`), and that namespace in `scope` (None: any), so a
    token can never lead a caller outside the namespaces it may see."""
    key = decode(token, b"")
    if key is None:
        return None
    head, separator, _ = key.partition(b"\x00")
    try:
        namespace = head.decode()
    except UnicodeDecodeError:
        raise _foreign() from None
    if (
        not separator
        or (scope is not None and namespace not in scope)
        or not key.startswith(prefix_of(namespace))
    ):
        raise _foreign()
    return namespace, key


def decode_within(token: str, prefixes: Sequence[bytes]) -> bytes | None:
    """`decode` for a listing over several key ranges: the token must lie
    inside one of them."""
    if not token:
        return None
    key = decode(token, b"")
    if key is None or not any(key.startswith(p) for p in prefixes):
        raise _foreign()
    return key


def decode_text(token: str, prefix: str) -> str | None:
    """`decode` for listings whose keys are text."""
    key = decode(token, prefix.encode())
    try:
        return None if key is None else key.decode()
    except UnicodeDecodeError:
        raise _foreign() from None


def _foreign() -> InvalidArgument:
    return InvalidArgument(
        [FieldViolation("page_token", "is not a token of this listing")]
    )
