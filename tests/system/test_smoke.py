"""The quickstart path works against a real daemon."""

from __future__ import annotations

from effectd_client import Client, Decision, State


def test_prepare_start_commit_then_repeat_returns_the_result(client: Client) -> None:
    """A repeated prepare of a committed call returns its stored result."""
    first = client.prepare_tool(
        "run-1", "call-1", "send_email", {"to": "a"}, start=True
    )
    assert first.decision is Decision.EXECUTE
    assert first.attempt_held
    client.commit_tool("run-1", "call-1", first.call.attempt, {"id": 1})
    again = client.prepare_tool("run-1", "call-1", "send_email", {"to": "a"})
    assert again.decision is Decision.RETURN_RESULT
    assert again.call.state is State.COMMITTED
    assert again.call.result is not None
    assert again.call.result.value == {"id": 1}
