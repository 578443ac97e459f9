"""The safe call (Python) on a shared store whose COMMIT's outcome the daemon
could not learn: UNAVAILABLE / STORAGE_UNAVAILABLE with
`mayHaveBeenApplied=true` is an unknown outcome, never a definite failure
that would let a repeat run the tool again (issue 14, "Faults").

The proxy applies the request on a real daemon, then answers that status,
as the daemon does when PostgreSQL committed but its answer was lost."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from effectd_client import (
    CallInProgress,
    Client,
    OutcomeUnknown,
    ReconciliationNeeded,
    RecordingRetry,
    ResultNotRecorded,
    Run,
    State,
    StorageUnavailable,
)
from effectd_client._safe_outcomes import is_unknown
from sidecar.testing import RunningDaemon
from tests.clients.flaky_proxy import Fault, FlakyProxy, flaky_proxy

FAST = RecordingRetry(attempts=4, deadline=20.0, initial_backoff=0.01)
MAYBE = (("mayHaveBeenApplied", "true"),)
APPLIED = Fault(
    grpc.StatusCode.UNAVAILABLE, "STORAGE_UNAVAILABLE", applied=True, metadata=MAYBE
)
NOT_APPLIED = Fault(grpc.StatusCode.UNAVAILABLE, "STORAGE_UNAVAILABLE", metadata=MAYBE)


@pytest.fixture
def proxy(daemon: RunningDaemon) -> Iterator[FlakyProxy]:
    with flaky_proxy(daemon.target) as p:
        yield p


@pytest.fixture
def via(proxy: FlakyProxy, session: bool) -> Iterator[Client]:
    with Client(proxy.target, recording_retry=FAST, session=session) as c:
        yield c


def _send(client: Client, runs: list[str], call_id: str) -> object:
    @Run(client, "run-maybe", lease_ms=60_000).tool("send_email")
    def send_email(to: str) -> str:
        runs.append(to)
        return f"sent to {to}"

    return send_email.at(call_id)("a@b.c")


def test_a_start_that_may_have_been_applied_is_never_run_again(
    via: Client, proxy: FlakyProxy, client: Client
) -> None:
    """Prepare-and-start committed, its answer says it may have been: the
    safe call raises it as an unknown outcome and runs nothing; a repeat
    finds the attempt held and runs nothing either."""
    proxy.fail("PrepareTool", APPLIED)
    runs: list[str] = []
    with pytest.raises(StorageUnavailable) as raised:
        _send(via, runs, "start")
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert raised.value.metadata == {"mayHaveBeenApplied": "true"}
    assert is_unknown(raised.value)
    assert client.get_tool_call("run-maybe", "start").state is State.STARTED
    with pytest.raises(CallInProgress):
        _send(via, runs, "start")
    assert runs == []


def test_a_commit_that_may_have_been_applied_is_sent_again_and_answered_done(
    via: Client, proxy: FlakyProxy, client: Client
) -> None:
    """The commit landed and its answer says it may have: the same commit
    again is answered as done; the tool ran once."""
    proxy.fail("CommitTool", APPLIED)
    runs: list[str] = []
    assert _send(via, runs, "commit") == "sent to a@b.c"
    assert runs == ["a@b.c"]
    assert proxy.calls.count("CommitTool") == 2
    call = client.get_tool_call("run-maybe", "commit")
    assert (call.state, call.history.count("commit")) == (State.COMMITTED, 1)


def test_a_commit_that_is_never_known_is_unknown_and_never_run_again(
    via: Client, proxy: FlakyProxy, client: Client
) -> None:
    """Every try of the commit answers `mayHaveBeenApplied=true`:
    ResultNotRecorded (an OutcomeUnknown), never a tool failure; the ledger
    holds the call UNKNOWN, and a repeat is RECONCILE, not a second run."""
    proxy.fail("CommitTool", *[NOT_APPLIED] * FAST.attempts)
    runs: list[str] = []
    with pytest.raises(ResultNotRecorded) as raised:
        _send(via, runs, "never")
    assert isinstance(raised.value, OutcomeUnknown)
    assert isinstance(raised.value.__cause__, StorageUnavailable)
    assert client.get_tool_call("run-maybe", "never").state is State.UNKNOWN
    with pytest.raises(ReconciliationNeeded):
        _send(via, runs, "never")
    assert runs == ["a@b.c"]
