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
        key = b""
    if not key.startswith(prefix):
        raise InvalidArgument(
            [FieldViolation("page_token", "is not a token of this listing")]
        )
    return key
