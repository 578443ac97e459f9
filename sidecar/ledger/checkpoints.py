"""The checkpoint store (ADR-010 D1, contract §8): key/value with revisions.

Every write states what it expects (a revision, or absence) and is refused
with REVISION_CONFLICT otherwise; there is no unconditional overwrite. A Txn
checks all its compares before it writes anything, inside one write
transaction, so it applies all or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.errors import RevisionConflict


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as stored: its value and the revision a write must expect."""

    key: str
    value: bytes
    revision: int
    updated_ns: int


@dataclass(frozen=True, slots=True)
class Expect:
    """What a write expects of a key: this revision, or (revision None) absence."""

    key: str
    revision: int | None


@dataclass(frozen=True, slots=True)
class Op:
    """A write of a Txn: a put (value) or a delete (value None)."""

    key: str
    value: bytes | None


def check(expect: Expect, current_revision: int | None) -> None:
    """Raises RevisionConflict unless the key's revision (None: absent) is
    what `expect` states."""
    have = 0 if current_revision is None else current_revision
    want = 0 if expect.revision is None else expect.revision
    if have != want:
        wanted = "absent" if expect.revision is None else f"at revision {want}"
        found = "absent" if current_revision is None else f"at revision {have}"
        raise RevisionConflict(
            f"checkpoint {expect.key!r} expected {wanted}, is {found}",
            have,
            {"key": expect.key},
        )
