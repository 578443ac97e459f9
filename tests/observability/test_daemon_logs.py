"""What the daemon's log says of what happens to it (issue 25 item 13): an
access line names the run, call and tool a call is about; the operator's
actions (approvals, rejections, reconciliations, backups, policy reloads)
are logged at info, not only audited; a client that ends its session stream
is not a CANCELLED call at info; and the "serving on" line names every
listener and the provider routes loaded."""

from __future__ import annotations

import logging

import pytest

from effectd_client import Client
from sidecar.testing import RunningDaemon

ACCESS = "effectd.access"


def access(caplog: pytest.LogCaptureFixture, method: str) -> list[dict[str, object]]:
    return [
        r.__dict__
        for r in caplog.records
        if r.name == ACCESS and r.__dict__.get("method") == f"/effectd.v1.{method}"
    ]


def test_an_access_line_names_the_run_the_call_and_the_tool(
    daemon: RunningDaemon, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """PrepareTool names all three in its request; CommitTool names the run
    and the call, and its line takes the tool from the record answered; over
    the session stream as over unary calls (fails before the fix: the line
    had the method, the code and the namespace only)."""
    caplog.set_level(logging.DEBUG, logger=ACCESS)
    held = client.prepare_tool("run-7", "call-3", "send_mail", {"to": "x"}, start=True)
    client.commit_tool("run-7", "call-3", held.call.attempt, {"sent": True})
    (prepared,) = access(caplog, "ToolLedger/PrepareTool")
    (committed,) = access(caplog, "ToolLedger/CommitTool")
    for line in (prepared, committed):
        assert (line["run"], line["call"], line["tool"]) == (
            "run-7",
            "call-3",
            "send_mail",
        )


def test_a_call_that_names_no_tool_call_has_none_in_its_line(
    daemon: RunningDaemon, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=ACCESS)
    client.put_checkpoint("k", b"v")
    (line,) = access(caplog, "Checkpoints/Put")
    assert (line["run"], line["call"], line["tool"]) == (None, None, None)
