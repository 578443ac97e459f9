"""The stored registration (`storage.daemons`): what it encodes comes back,
and a registration written before renewals were recorded still reads."""

from __future__ import annotations

import json

from sidecar.ledger.ownership import Registration
from sidecar.storage import daemons


def test_a_registration_round_trips_with_its_latest_renewal() -> None:
    reg = Registration("pod-a", 7, 100, 200, 0, 0, renewed_ns=150)
    assert daemons.decode(daemons.encode(reg)) == reg


def test_a_registration_without_a_renewal_time_reads_as_never_renewed() -> None:
    """The document of a daemon that did not record renewals: its last
    vouching is its registration."""
    doc = json.loads(daemons.encode(Registration("pod-a", 7, 100, 200)))
    del doc["renewed"]
    reg = daemons.decode(json.dumps(doc).encode())
    assert (reg.renewed_ns, reg.vouched_ns) == (0, 100)
