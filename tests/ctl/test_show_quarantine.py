"""`effectd ctl show` says when an UNKNOWN call's quarantine ends, the
time from which `reconcile --not-executed` needs no confirmation (issue 25
item 10, the daemon's `quarantine_ends_at`)."""

from __future__ import annotations

from effectd_client import Client
from sidecar.clock import ManualClock
from tests.ctl.conftest import Ctl
from tests.ctl.support import RUN, unknown


def _line(out: str) -> str:
    return next(x for x in out.splitlines() if x.startswith("quarantine "))


def test_show_says_when_the_quarantine_ends(
    ctl: Ctl, agent: Client, clock: ManualClock
) -> None:
    """90 s (3 leases of 30 s) after the outcome became unknown; the manual
    clock of the daemon is years behind ctl's, so it reads as over, and a
    call that is not UNKNOWN has none."""
    unknown(agent, "c1")
    out = ctl("show", RUN, "c1")[1]
    assert _line(out) == (
        "quarantine    ends 2023-11-14T22:14:50.000Z (over: --not-executed is accepted)"
    )
    agent.prepare_tool(RUN, "c2", "search", {"q": 1})
    assert _line(ctl("show", RUN, "c2")[1]).split() == ["quarantine", "-"]
