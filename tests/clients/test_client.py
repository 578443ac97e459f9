"""The typed Python client covers the operator and recovery flows end to end."""

from __future__ import annotations

import json

import pytest

from effectd_client import Client, Decision, RecoveryAction, RecoveryPlan, State
from sidecar.clock import ManualClock
from sidecar.testing import RunningDaemon


def test_approval_then_execution(client: Client) -> None:
    """An approved call executes; the approval is bound to what was seen."""
    waiting = client.prepare_tool(
        "run-a", "pay", "send_payment", {"cents": 5}, require_approval=True
    )
    assert waiting.decision is Decision.AWAIT_APPROVAL
    client.decide_approval(
        "run-a",
        "pay",
        approve=True,
        approver="ada",
        reason="expected invoice",
        expected_revision=waiting.call.revision,
        input_fingerprint=waiting.call.input_fingerprint,
    )
    started = client.prepare_tool(
        "run-a", "pay", "send_payment", {"cents": 5}, start=True
    )
    assert started.decision is Decision.EXECUTE
    assert started.attempt_held


def test_the_approver_reads_the_kept_input(client: Client) -> None:
    """`get_tool_call` of a call awaiting approval carries its input as sent
    (issue 10 item 29: fails before the fix: only the fingerprint was kept)."""
    client.prepare_tool(
        "run-k", "pay", "send_payment", {"cents": 5}, require_approval=True
    )
    seen = client.get_tool_call("run-k", "pay")
    assert seen.kept_input_json is not None
    assert json.loads(seen.kept_input_json) == {"cents": 5}
    assert seen.kept_input_raw is None


def test_recover_then_reconcile(client: Client, clock: ManualClock) -> None:
    """After a lost attempt the plan says RECONCILE; an operator resolves it."""
    done = client.prepare_tool("run-b", "read", "search", {"q": 1}, start=True)
    client.commit_tool("run-b", "read", done.call.attempt, {"hits": 3})
    lost = client.prepare_tool("run-b", "mail", "send_email", {"to": "x"}, start=True)
    assert lost.attempt_held
    clock.advance(3600)  # the lease of the lost attempt runs out

    plan = client.recover("run-b")
    actions = {i.call.call_id: i.action for i in plan.items}
    assert actions == {
        "mail": RecoveryAction.RECONCILE,
        "read": RecoveryAction.REPLAY_RESULT,
    }
    assert plan.interrupted
    replayed = next(i for i in plan.items if i.call.call_id == "read")
    assert replayed.result is not None
    assert replayed.result.value == {"hits": 3}
    client.acknowledge_recovery("run-b", ["read"])

    unknown = client.get_tool_call("run-b", "mail")
    assert unknown.state is State.UNKNOWN
    resolved = client.reconcile(
        "run-b",
        "mail",
        expected_revision=unknown.revision,
        operator="grace",
        reason="found in the mail server's sent folder",
        evidence="message-id <42@example.com>",
        result={"sent": True},
    )
    assert resolved.state is State.COMMITTED
    assert not client.recover("run-b").interrupted


def test_list_tool_calls_of_every_namespace(
    client: Client, daemon: RunningDaemon
) -> None:
    """`all_namespaces=True` lists the calls of every namespace the caller may
    see; without it, only the client's namespace (issue 10 item 30: fails
    before the fix: there was no such parameter)."""
    client.prepare_tool("run-c", "mine", "search", {"q": 1})
    with Client(daemon.target, namespace="elsewhere") as other:
        other.prepare_tool("run-c", "theirs", "search", {"q": 2})
    every = client.list_tool_calls("run-c", all_namespaces=True, page_size=1)
    assert [(c.namespace, c.call_id) for c in every] == [
        ("default", "mine"),
        ("elsewhere", "theirs"),
    ]
    assert [c.call_id for c in client.list_tool_calls("run-c")] == ["mine"]


def test_recover_joins_the_pages_it_reads_ahead(client: Client) -> None:
    """`recover` asks for the next page while it converts the last one: the
    plan is the pages of `recover_pages` joined, in order, whatever the
    page size."""
    for i in range(7):
        done = client.prepare_tool("run-p", f"c{i}", "search", {"q": i}, start=True)
        if i % 2:
            client.commit_tool("run-p", f"c{i}", done.call.attempt, {"hits": i})
    pages = list(client.recover_pages("run-p", page_size=7))
    for size in (1, 2, 3, 7, 1000):
        assert client.recover("run-p", page_size=size).items == pages[0].items


def test_recover_stops_at_a_page_it_cannot_convert(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page that fails to convert ends the recovery with its error; the
    page asked for ahead is cancelled, never waited for."""
    for i in range(3):
        client.prepare_tool("run-q", f"c{i}", "search", {"q": i})

    def broken(msg: object) -> RecoveryPlan:
        raise ValueError("unknown action 99")

    monkeypatch.setattr(RecoveryPlan, "from_pb", broken)
    with pytest.raises(ValueError, match="99"):
        client.recover("run-q", page_size=1)
