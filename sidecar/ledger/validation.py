"""Field rules for everything a client sends (contract §3.1, §11.1).

Each check appends `FieldViolation`s instead of raising, so one answer names
every bad field of a request. `require` raises them together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.errors import FieldViolation, InvalidArgument
from sidecar.ledger.model import DEFAULT_NAMESPACE

_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# C0, DEL and C1 control characters; also refuses NUL, which storage keys use
# as a separator, and \x01, which marks a hashed part (`storage.keys`).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class Limits:
    """Sizes and bounds the daemon enforces on requests. Identifiers and keys
    are measured in bytes of UTF-8, as stored; every size accepted here is
    storable (`storage.keys`; `tests/storage/test_keys.py` measures it)."""

    max_id_bytes: int = 256
    max_key_bytes: int = 512
    max_text_bytes: int = 4096
    max_payload_bytes: int = 1 << 20
    max_batch: int = 256
    max_txn_ops: int = 128
    max_page_size: int = 1000
    default_page_size: int = 100
    max_lease_ms: int = 3_600_000


class Violations:
    """Collects field violations of one request."""

    def __init__(self) -> None:
        self.items: list[FieldViolation] = []

    def add(self, field: str, description: str) -> None:
        self.items.append(FieldViolation(field, description))

    def require(self) -> None:
        if self.items:
            raise InvalidArgument(self.items)

    def namespace(self, field: str, value: str) -> str:
        """Validates a namespace; empty means the default one."""
        if not value:
            return DEFAULT_NAMESPACE
        if not _NAMESPACE.fullmatch(value):
            self.add(field, "must be 1..64 characters of A-Z a-z 0-9 . _ -")
        return value

    def text_id(
        self, field: str, value: str, max_bytes: int, *, no_colon: bool = False
    ) -> None:
        """A required identifier: non-empty UTF-8 without control characters."""
        size = len(value.encode("utf-8", "surrogatepass"))
        if size == 0:
            self.add(field, "is required")
        elif size > max_bytes:
            self.add(field, f"must be at most {max_bytes} bytes of UTF-8, got {size}")
        if _CONTROL.search(value):
            self.add(field, "must not contain control characters")
        if _has_surrogate(value):
            self.add(field, "must be valid UTF-8")
        if no_colon and ":" in value:
            self.add(
                field, "must not contain ':' (the idempotency key is run_id:call_id)"
            )

    def text(self, field: str, value: str, max_bytes: int) -> None:
        """Optional free text (reasons, actors): bounded, printable lines."""
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            self.add(field, f"must be at most {max_bytes} bytes, got {size}")
        if _CONTROL.search(value.replace("\n", "").replace("\t", "")):
            self.add(
                field, "must not contain control characters other than newline and tab"
            )
        if _has_surrogate(value):
            self.add(field, "must be valid UTF-8")

    def size(self, field: str, data: bytes, max_bytes: int) -> None:
        if len(data) > max_bytes:
            self.add(field, f"must be at most {max_bytes} bytes, got {len(data)}")

    def bounded(self, field: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            self.add(field, f"must be between {low} and {high}, got {value}")


def _has_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
