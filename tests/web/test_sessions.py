"""The console's sessions: an idle one ends (and closes its channel), a
used one stays, and no id or an unknown id is no session."""

from __future__ import annotations

from typing import cast

from sidecar.web.daemon import Daemon
from sidecar.web.sessions import IDLE_SECONDS, Session, Sessions


class _Channel:
    closed = 0

    def close(self) -> None:
        self.closed += 1


def test_an_idle_session_ends_and_a_used_one_stays() -> None:
    now = [1000.0]
    sessions = Sessions(now=lambda: now[0])
    idle, used = _Channel(), _Channel()
    idle_id = sessions.open(Session(cast(Daemon, idle), "", "", used=now[0]))
    used_id = sessions.open(Session(cast(Daemon, used), "", "", used=now[0]))
    assert sessions.get(None) is None
    assert sessions.get("unknown") is None
    now[0] += IDLE_SECONDS - 1
    assert sessions.get(used_id) is not None
    assert idle.closed == 0
    now[0] += 2
    # The used one was touched a second ago; the idle one is past its time.
    assert sessions.get(used_id) is not None
    assert sessions.get(idle_id) is None
    assert idle.closed == 1
    sessions.close_all()
    assert used.closed == 1
    assert sessions.get(used_id) is None
