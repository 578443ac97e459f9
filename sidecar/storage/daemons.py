"""How daemon registrations and pass locks are laid out in the store
(`ledger.ownership`).

`Table.DAEMONS` maps an incarnation (8 bytes big-endian) to the registration
of the daemon that opened the store under it, and `Table.PASSES` the name of
a periodic pass to its lock, each a small JSON document.

Neither table changes the LMDB store's format: a daemon that does not know
them serves an exclusive store as before (every earlier incarnation is gone
to it), and a daemon that knows them ends, at its start, every registration
it finds there and takes over any pass lock (`ownership.register`,
`ownership.may_run` on an exclusive store).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from sidecar.ledger.ownership import PassLock, Registration
from sidecar.storage.api import Table, Tables, WritableTables

_VERSION = 1
_INCARNATION_BYTES = 8


class DaemonsFormatError(ValueError):
    """A stored registration or lock of a version this daemon cannot read."""


def key(incarnation: int) -> bytes:
    return incarnation.to_bytes(_INCARNATION_BYTES, "big")


def encode(reg: Registration) -> bytes:
    doc = {
        "v": _VERSION,
        "id": reg.daemon_id,
        "inc": reg.incarnation,
        "registered": reg.registered_ns,
        "expires": reg.expires_ns,
        "ended": reg.ended_ns,
        "superseded_by": reg.superseded_by,
        "renewed": reg.renewed_ns,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def decode(raw: bytes) -> Registration:
    doc = json.loads(raw)
    if doc.get("v") != _VERSION:
        raise DaemonsFormatError(f"daemon registration version {doc.get('v')!r}")
    return Registration(
        daemon_id=doc["id"],
        incarnation=doc["inc"],
        registered_ns=doc["registered"],
        expires_ns=doc["expires"],
        ended_ns=doc["ended"],
        superseded_by=doc["superseded_by"],
        # Absent in a registration an earlier daemon wrote: never renewed
        # as far as it tells.
        renewed_ns=doc.get("renewed", 0),
    )


def load(view: Tables, incarnation: int) -> Registration | None:
    raw = view.get(Table.DAEMONS, key(incarnation))
    return None if raw is None else decode(raw)


def save(view: WritableTables, reg: Registration) -> None:
    view.put(Table.DAEMONS, key(reg.incarnation), encode(reg))


def forget(view: WritableTables, incarnation: int) -> None:
    view.delete(Table.DAEMONS, key(incarnation))


def every(view: Tables) -> Iterator[Registration]:
    """Every registration the store keeps, oldest incarnation first."""
    for _, raw in view.scan(Table.DAEMONS, b""):
        yield decode(raw)


def encode_lock(lock: PassLock) -> bytes:
    doc = {
        "v": _VERSION,
        "holder": lock.holder,
        "id": lock.daemon_id,
        "until": lock.until_ns,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def decode_lock(raw: bytes) -> PassLock:
    doc = json.loads(raw)
    if doc.get("v") != _VERSION:
        raise DaemonsFormatError(f"pass lock version {doc.get('v')!r}")
    return PassLock(holder=doc["holder"], daemon_id=doc["id"], until_ns=doc["until"])


def load_lock(view: Tables, name: str) -> PassLock | None:
    raw = view.get(Table.PASSES, name.encode())
    return None if raw is None else decode_lock(raw)


def save_lock(view: WritableTables, name: str, lock: PassLock) -> None:
    view.put(Table.PASSES, name.encode(), encode_lock(lock))
