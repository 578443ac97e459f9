"""The recording requests are idempotent on the daemon, which is what makes a
client's retry of them safe: CommitTool, ReportUnknown, Heartbeat and
AcknowledgeRecovery sent again with the same attempt are answered as the first
time and change the record once; another result is a conflict."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from effectd_client import (
    Client,
    Effect,
    RecordingRetry,
    ResultMismatch,
    StaleAttempt,
    State,
    ToolCall,
)
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import running_daemon

ONCE = RecordingRetry(attempts=1)  # each request exactly once, as sent


def started(client: Client, call_id: str = "c") -> int:
    return client.prepare_tool("run", call_id, "t", {}, start=True).call.attempt


Send = Callable[[Client, int], ToolCall]


@pytest.mark.parametrize(
    ("send", "event"),
    [
        pytest.param(
            lambda c, a: c.commit_tool("run", "c", a, {"n": 1}, retry=ONCE),
            "commit",
            id="commit-ok",
        ),
        pytest.param(
            lambda c, a: c.commit_tool(
                "run", "c", a, error_code="E", error_message="no", retry=ONCE
            ),
            "commit",
            id="commit-error",
        ),
        pytest.param(
            lambda c, a: c.report_unknown("run", "c", a, "lost", retry=ONCE),
            "report_unknown",
            id="report-unknown",
        ),
        pytest.param(
            lambda c, a: c.heartbeat("run", "c", a, retry=ONCE),
            None,
            id="heartbeat",
        ),
    ],
)
def test_a_recording_request_sent_twice_is_answered_the_same(
    client: Client, send: Send, event: str | None
) -> None:
    """The second copy (a client's retry after a lost answer) is answered as
    the first, with the record changed once."""
    attempt = started(client)
    first = send(client, attempt)
    second = send(client, attempt)
    assert (second.state, second.attempt, second.result) == (
        first.state,
        first.attempt,
        first.result,
    )
    if event is not None:
        assert second.revision == first.revision
        assert second.history.count(event) == 1


def test_acknowledging_twice_is_answered_the_same(client: Client) -> None:
    attempt = started(client)
    client.commit_tool("run", "c", attempt, 1)
    client.acknowledge_recovery("run", ["c"], retry=ONCE)
    client.acknowledge_recovery("run", ["c"], retry=ONCE)
    assert client.get_tool_call("run", "c").history.count("acknowledge") == 1


def test_a_commit_of_another_result_is_a_conflict(client: Client) -> None:
    """A repeat is done only when it is the same result: another one is
    RESULT_MISMATCH and the first result stands."""
    attempt = started(client)
    client.commit_tool("run", "c", attempt, {"n": 1})
    with pytest.raises(ResultMismatch):
        client.commit_tool("run", "c", attempt, {"n": 2}, retry=ONCE)
    stored = client.get_tool_call("run", "c").result
    assert stored is not None
    assert stored.value == {"n": 1}


def test_a_stale_attempt_is_refused_every_time(
    client: Client, clock: ManualClock
) -> None:
    """Retrying never turns a stale attempt into the holder."""
    p = client.prepare_tool("run", "c", "t", {}, effect=Effect.READ, start=True)
    attempt = p.call.attempt
    client.report_unknown("run", "c", attempt, "cut off")
    retried = client.start_tool("run", "c", retry=True)
    assert retried.call.attempt == attempt + 1
    for _ in range(2):
        with pytest.raises(StaleAttempt):
            client.commit_tool("run", "c", attempt, 1, retry=ONCE)


def test_the_same_attempt_commits_after_its_lease_ran_out(
    client: Client, clock: ManualClock
) -> None:
    """A late commit of the attempt that ran resolves its UNKNOWN record."""
    attempt = started(client)
    clock.advance(3600)
    assert client.get_tool_call("run", "c").state is State.STARTED  # lazily
    client.prepare_tool("run", "c", "t", {})  # settles it: UNKNOWN
    assert client.get_tool_call("run", "c").state is State.UNKNOWN
    done = client.commit_tool("run", "c", attempt, "ok", retry=ONCE)
    again = client.commit_tool("run", "c", attempt, "ok", retry=ONCE)
    assert (done.state, again.revision) == (State.COMMITTED, done.revision)


def test_the_same_attempt_commits_after_a_daemon_restart(
    config: ServeConfig, clock: ManualClock
) -> None:
    """The attempt started before a restart commits after it, once."""
    with running_daemon(config, clock) as daemon, Client(daemon.target) as client:
        attempt = started(client)
    with running_daemon(config, clock) as daemon, Client(daemon.target) as client:
        assert client.get_tool_call("run", "c").state is State.UNKNOWN
        done = client.commit_tool("run", "c", attempt, "ok", retry=ONCE)
        again = client.commit_tool("run", "c", attempt, "ok", retry=ONCE)
    assert done.state is State.COMMITTED
    assert again.revision == done.revision
    assert done.history[-2:] == ("restart", "commit")
