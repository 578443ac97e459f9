"""Page tokens: the last key of the previous page, opaque to clients.

A token must lie inside the listing it continues (its prefix), so a token
forged or copied from another listing can never reach another namespace.
"""

from __future__ import annotations

import base64
import binascii

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
