"""What a restore does to each record, as a table, and the marker it leaves."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sidecar.ledger import audit, restore
from sidecar.ledger.model import Effect, Event, State, ToolCall
from sidecar.ledger.restore import Marker
from tests.ledger.builders import (
    WALL0,
    awaiting,
    committed,
    prepared,
    rejected,
    started,
    unknown,
)

SE = Effect.SIDE_EFFECT


@pytest.mark.parametrize(
    ("build", "want"),
    [
        # Open at the backup: anything may have happened since (ADR-010 D1, R3).
        (prepared, State.UNKNOWN),
        (awaiting, State.UNKNOWN),
        (started, State.UNKNOWN),
        # Already waiting for an operator, or decided: as they are.
        (unknown, State.UNKNOWN),
        (committed, State.COMMITTED),
        (rejected, State.COMMITTED),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_every_call_not_committed_becomes_unknown(
    build: Callable[[Effect], ToolCall], want: State
) -> None:
    call = build(SE)
    after = restore.restored(call, at_ns=WALL0 + 1, actor="olga")
    assert after.state is want
    if call.state in restore.OPEN_STATES:
        assert after.revision == call.revision + 1
        assert after.lease is None
        entry = after.history[-1]
        assert (entry.event, entry.actor, entry.reason) == (
            Event.RESTORE,
            "olga",
            restore.REASON,
        )
    else:
        assert after is call


def test_the_marker_round_trips_and_is_audited() -> None:
    marker = Marker(WALL0, "olga", "disk died", "/b", 4, 3, 2, 9)
    assert restore.decode(restore.encode(marker)) == marker
    fact = restore.fact(marker)
    assert fact.action is audit.Action.RESTORE
    assert (fact.actor, fact.reason, fact.run_id) == ("olga", "disk died", "")
    assert dict(fact.details) == {
        "backup": "/b",
        "backupIncarnation": "4",
        "madeUnknown": "3",
        "restores": "2",
    }
