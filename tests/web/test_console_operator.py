"""What an operator must see in the console to decide (issue 25): the state
a person reads, how long each call has waited, when "never ran" becomes
allowed, who is signed in, the input of each queued call, the other calls of
the run; and the console's own limits on idle connections and sessions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from effectd_client import Client
from sidecar.testing import RunningDaemon
from sidecar.web import ConsoleServer
from tests.support.tokens import APPROVER_ANA, ONCALL_OLA
from tests.web.support import (
    NAMESPACE,
    RUN,
    Browserless,
    agent,
    awaiting,
    console_daemon,
)


@pytest.fixture
def served(short_tmp: Path) -> Iterator[tuple[RunningDaemon, ConsoleServer]]:
    with console_daemon(short_tmp / "data") as both:
        yield both


def _call_path(call_id: str) -> str:
    return f"/call?namespace={NAMESPACE}&run={RUN}&call={call_id}"


def _reject(daemon: RunningDaemon, call_id: str) -> None:
    with Client(
        daemon.target, namespace=NAMESPACE, token=APPROVER_ANA.secret, session=False
    ) as approver:
        seen = approver.get_tool_call(RUN, call_id)
        approver.decide_approval(
            RUN,
            call_id,
            approve=False,
            approver="",
            reason="wrong customer",
            expected_revision=seen.revision,
            input_fingerprint=seen.input_fingerprint,
        )


REJECTED = '<span class="state state-rejected">REJECTED</span>'


def test_a_rejected_call_reads_rejected_on_the_run_call_and_audit_pages(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """The run's table, the call's state and history, and the audit log say
    REJECTED for a rejected call (issue 25 item 8: fails before the fix: they
    said COMMITTED); a call the agent committed with an error of its own
    still says COMMITTED (the control)."""
    daemon, server = served
    awaiting(daemon, "c-1")
    _reject(daemon, "c-1")
    with agent(daemon) as c:
        held = c.prepare_tool(RUN, "c-2", "charge", {"id": 2}, start=True)
        c.commit_tool(RUN, "c-2", held.call.attempt, error_code="DECLINED")
    b = Browserless(server.url)
    b.sign_in(ONCALL_OLA.secret)
    run = b.get(f"/run?namespace={NAMESPACE}&run={RUN}").body
    assert run.count(REJECTED) == 1
    assert run.count('<span class="state state-committed">COMMITTED</span>') == 1
    call = b.get(_call_path("c-1")).body
    assert f"<dt>State</dt><dd>{REJECTED}</dd>" in call
    assert '<td data-label="To">REJECTED</td>' in call
    assert '<td data-label="To">COMMITTED</td>' not in call
    audit = b.get("/audit").body
    assert "AWAITING_APPROVAL → REJECTED" in audit
    other = b.get(_call_path("c-2")).body
    assert '<dt>State</dt><dd><span class="state state-committed">' in other
