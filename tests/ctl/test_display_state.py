"""A call an approver rejected reads REJECTED wherever `effectd ctl` shows a
state (issue 25 item 8): on the wire it stays COMMITTED with the error result
APPROVAL_REJECTED (contract §4.5), and the JSON keeps that as `state`."""

from __future__ import annotations

import json

from effectd_client import Client
from tests.ctl.conftest import Ctl
from tests.ctl.support import RUN, awaiting, rows


def test_a_rejected_call_reads_rejected_in_every_view(ctl: Ctl, agent: Client) -> None:
    """`reject`'s own answer, `list`, `show` (its state and its history),
    `recover` and `audit list` all say REJECTED (fails before the fix: each
    said COMMITTED)."""
    awaiting(agent, "c1")
    code, out, _ = ctl("reject", RUN, "c1", "--reason", "wrong customer")
    assert code == 0
    assert rows(out)[0][0] == "REJECTED"
    assert [r[1] for r in rows(ctl("list")[1])] == ["REJECTED"]
    shown = ctl("show", RUN, "c1")[1]
    assert "state         REJECTED" in shown
    history = rows(shown.split("\nhistory\n", 1)[1])
    assert [(r[2], r[3], r[4]) for r in history] == [
        ("prepare", "-", "AWAITING_APPROVAL"),
        ("reject", "AWAITING_APPROVAL", "REJECTED"),
    ]
    plan = rows(ctl("recover", RUN)[1])
    assert [(r[0], r[3]) for r in plan] == [("ERROR_RESULT", "REJECTED")]
    [entry] = rows(ctl("audit", "list")[1])
    assert entry[5] == "AWAITING_APPROVAL->REJECTED"


def test_the_json_keeps_the_wire_state_beside_the_display_state(
    ctl: Ctl, agent: Client
) -> None:
    """`state` is the contract's COMMITTED; `display_state` is what a person
    reads."""
    awaiting(agent, "c1")
    ctl("reject", RUN, "c1", "--reason", "no")
    call = json.loads(ctl("--json", "show", RUN, "c1")[1])
    assert (call["state"], call["display_state"]) == ("COMMITTED", "REJECTED")
    assert call["result"]["error_code"] == "APPROVAL_REJECTED"


def test_an_error_result_of_the_agent_stays_committed(ctl: Ctl, agent: Client) -> None:
    """Control: a call the agent committed with an error of its own is not a
    rejection, and reads COMMITTED everywhere."""
    held = agent.prepare_tool(RUN, "c2", "charge", {"id": 2}, start=True)
    agent.commit_tool(RUN, "c2", held.call.attempt, error_code="DECLINED")
    assert [r[1] for r in rows(ctl("list")[1])] == ["COMMITTED"]
    assert "state         COMMITTED" in ctl("show", RUN, "c2")[1]
    assert [r[3] for r in rows(ctl("recover", RUN)[1])] == ["COMMITTED"]
    call = json.loads(ctl("--json", "show", RUN, "c2")[1])
    assert (call["state"], call["display_state"]) == ("COMMITTED", "COMMITTED")
