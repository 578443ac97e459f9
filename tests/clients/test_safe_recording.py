"""A tool that ran never loses its result to a transient failure of the
ledger: CommitTool, ReportUnknown, Heartbeat and AcknowledgeRecovery are sent
again with the same attempt, and what finally cannot be recorded is raised as
`ResultNotRecorded`, never as a failure of the tool."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack

import grpc
import pytest

from effectd_client import (
    AsyncClient,
    AsyncRun,
    Client,
    EffectdError,
    OutcomeUnknown,
    RecordingRetry,
    ResultNotRecorded,
    Run,
    StaleAttempt,
    State,
)
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.clients.flaky_proxy import Fault, FlakyProxy, flaky_proxy

# Fast and bounded: no test waits more than a few tenths of a second.
FAST = RecordingRetry(attempts=5, deadline=20.0, initial_backoff=0.01)
LOST = Fault(grpc.StatusCode.UNAVAILABLE, lost=True)


@pytest.fixture
def proxy(daemon: RunningDaemon) -> Iterator[FlakyProxy]:
    with flaky_proxy(daemon.target) as p:
        yield p


@pytest.fixture
def via(proxy: FlakyProxy, session: bool) -> Iterator[Client]:
    """A client whose requests go through the flaky proxy (over its session
    stream, where a lost answer is a stream broken, or unary calls)."""
    with Client(proxy.target, recording_retry=FAST, session=session) as c:
        yield c


def send(client: Client, runs: list[str], run_id: str = "run-rec") -> object:
    @Run(client, run_id).tool("send_email")
    def send_email(to: str) -> dict[str, str]:
        runs.append(to)
        return {"sent_to": to}

    return send_email.at("mail")("a@b.c")


def test_a_commit_whose_answer_was_lost_is_sent_again_and_answered_as_done(
    via: Client, proxy: FlakyProxy, client: Client
) -> None:
    """The daemon stored the commit but its answer was lost: the same commit
    again is answered as done, and the call returns the tool's result
    (issue 10 item B6: fails before the fix: UNAVAILABLE raised, the tool
    ran once and its caller saw a failure)."""
    proxy.fail("CommitTool", LOST)
    runs: list[str] = []
    assert send(via, runs) == {"sent_to": "a@b.c"}
    assert runs == ["a@b.c"]
    assert proxy.calls.count("CommitTool") == 2
    call = client.get_tool_call("run-rec", "mail")
    assert call.state is State.COMMITTED
    assert call.history.count("commit") == 1


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(Fault(grpc.StatusCode.UNAVAILABLE), id="unavailable"),
        pytest.param(
            Fault(grpc.StatusCode.UNAVAILABLE, reason="STORAGE_UNAVAILABLE"),
            id="storage-unavailable",
        ),
        pytest.param(
            Fault(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                reason="RATE_LIMITED",
                retry_delay=0.05,
            ),
            id="rate-limited-with-retry-info",
        ),
        pytest.param(Fault(grpc.StatusCode.DEADLINE_EXCEEDED), id="deadline"),
    ],
)
def test_a_transient_refusal_of_a_commit_is_retried(
    via: Client, proxy: FlakyProxy, client: Client, fault: Fault
) -> None:
    """UNAVAILABLE, a try's deadline, and a refusal carrying RetryInfo are
    retried with the same attempt (issue 10 item B6: fails before the fix)."""
    proxy.fail("CommitTool", fault, fault)
    runs: list[str] = []
    assert send(via, runs) == {"sent_to": "a@b.c"}
    assert proxy.calls.count("CommitTool") == 3
    call = client.get_tool_call("run-rec", "mail")
    assert (call.state, call.attempt) == (State.COMMITTED, 1)


def test_a_definite_refusal_is_not_retried(via: Client, proxy: FlakyProxy) -> None:
    """STALE_ATTEMPT will not change by asking again: one try, then
    ResultNotRecorded carrying the result and the refusal."""
    proxy.fail(
        "CommitTool", Fault(grpc.StatusCode.FAILED_PRECONDITION, "STALE_ATTEMPT")
    )
    runs: list[str] = []
    with pytest.raises(ResultNotRecorded) as raised:
        send(via, runs)
    assert proxy.calls.count("CommitTool") == 1
    assert raised.value.result == {"sent_to": "a@b.c"}
    assert isinstance(raised.value.__cause__, StaleAttempt)


def test_a_result_that_cannot_be_recorded_is_unknown_never_a_failure(
    via: Client, proxy: FlakyProxy, client: Client
) -> None:
    """When every try fails, the caller gets ResultNotRecorded (an
    OutcomeUnknown) with the result; the ledger says UNKNOWN with the reason,
    never an error result (issue 10 item B6: fails before the fix: a bare
    UNAVAILABLE EffectdError, the call left STARTED)."""
    proxy.fail("CommitTool", *[Fault()] * FAST.attempts)
    runs: list[str] = []
    with pytest.raises(ResultNotRecorded) as raised:
        send(via, runs)
    assert isinstance(raised.value, OutcomeUnknown)
    assert raised.value.result == {"sent_to": "a@b.c"}
    assert raised.value.error is None
    assert proxy.calls.count("CommitTool") == FAST.attempts
    call = client.get_tool_call("run-rec", "mail")
    assert (call.state, call.result) == (State.UNKNOWN, None)


def test_negative_control_without_retries_a_lost_answer_loses_the_result(
    proxy: FlakyProxy, session: bool
) -> None:
    """The lost-answer check above fails for a client that tries once."""
    proxy.fail("CommitTool", LOST)
    once = RecordingRetry(attempts=1)
    with (
        Client(proxy.target, recording_retry=once, session=session) as single,
        pytest.raises(ResultNotRecorded),
    ):
        send(single, [])
    assert proxy.calls.count("CommitTool") == 1


def test_a_report_unknown_whose_answer_was_lost_is_sent_again(
    via: Client, proxy: FlakyProxy, client: Client
) -> None:
    """ReportUnknown again with the same attempt is answered as before; the
    tool's own exception is what the caller sees (issue 10 item B6)."""
    proxy.fail("ReportUnknown", LOST)

    @Run(via, "run-rep").tool("pay")
    def pay() -> None:
        raise TimeoutError("the payment API did not answer")

    with pytest.raises(TimeoutError, match="did not answer"):
        pay.at("p")()
    assert proxy.calls.count("ReportUnknown") == 2
    call = client.get_tool_call("run-rep", "p")
    assert call.state is State.UNKNOWN
    assert call.history.count("report_unknown") == 1


def test_an_error_commit_that_cannot_be_recorded_carries_the_error(
    via: Client, proxy: FlakyProxy
) -> None:
    """A definite failure the ledger cannot record is ResultNotRecorded with
    the tool's exception as `error`."""
    proxy.fail("CommitTool", *[Fault()] * FAST.attempts)

    @Run(via, "run-err").tool("lookup")
    def lookup() -> None:
        raise KeyError("no such user")

    with pytest.raises(ResultNotRecorded) as raised:
        lookup.at("q")()
    assert isinstance(raised.value.error, KeyError)


def test_heartbeat_and_acknowledge_are_retried(
    via: Client, proxy: FlakyProxy, client: Client
) -> None:
    """Both recording requests survive a lost answer and a dropped one."""
    p = via.prepare_tool("run-hb", "c", "t", {}, start=True)
    proxy.fail("Heartbeat", Fault(), LOST)
    via.heartbeat("run-hb", "c", p.call.attempt)
    via.heartbeat("run-hb", "c", p.call.attempt)
    via.commit_tool("run-hb", "c", p.call.attempt, {"ok": True})
    proxy.fail("AcknowledgeRecovery", LOST)
    via.acknowledge_recovery("run-hb", ["c"])
    assert proxy.calls.count("Heartbeat") == 4  # 3 tries, then 1
    assert proxy.calls.count("AcknowledgeRecovery") == 2
    assert client.get_tool_call("run-hb", "c").acknowledged


def test_the_async_client_retries_a_lost_commit(
    proxy: FlakyProxy, client: Client, session: bool
) -> None:
    """AsyncRun gets the same retries (issue 10 item B6: fails before the fix)."""
    proxy.fail("CommitTool", LOST)

    async def main() -> object:
        async with AsyncClient(
            proxy.target, recording_retry=FAST, session=session
        ) as c:

            @AsyncRun(c, "run-aio").tool("send")
            async def send(to: str) -> str:
                return to

            return await send.at("m")("x")

    assert asyncio.run(main()) == "x"
    assert proxy.calls.count("CommitTool") == 2
    assert client.get_tool_call("run-aio", "m").state is State.COMMITTED


def test_a_daemon_restart_between_the_tool_and_its_commit_loses_nothing(
    config: ServeConfig, clock: ManualClock, session: bool
) -> None:
    """The daemon stops after the tool ran and before its commit; the commit
    fails, the daemon starts again on the same store, and the retried commit
    of the same attempt is recorded (issue 10 item B6: fails before the fix:
    UNAVAILABLE raised and the result lost)."""
    with ExitStack() as daemons:
        first = daemons.enter_context(ExitStack())
        daemon = first.enter_context(running_daemon(config, clock))
        retries: list[str] = []

        def restart(error: EffectdError, wait: float) -> None:
            retries.append(error.code.name)
            if len(retries) == 1:
                daemons.enter_context(running_daemon(config, clock))

        policy = RecordingRetry(attempts=20, deadline=60.0, on_retry=restart)
        with Client(daemon.target, recording_retry=policy, session=session) as client:

            @Run(client, "run-restart").tool("send_email")
            def send_email(to: str) -> str:
                first.close()  # the daemon stops while the tool finishes
                return f"sent to {to}"

            assert send_email.at("mail")("a@b.c") == "sent to a@b.c"
            call = client.get_tool_call("run-restart", "mail")
        assert retries[0] == "UNAVAILABLE"
        assert call.state is State.COMMITTED
        assert call.result is not None
        assert (call.result.value, call.attempt) == ("sent to a@b.c", 1)
        assert call.history[-2:] == ("commit", "acknowledge")


def test_policy_waits_grow_honour_retry_info_and_stop_at_the_deadline() -> None:
    """The retry policy's table: backoff doubles to its cap, RetryInfo is
    never undercut, and no wait passes the deadline or the attempts."""
    policy = RecordingRetry(
        attempts=5, deadline=3.0, initial_backoff=0.2, max_backoff=0.5
    )
    down = EffectdError(grpc.StatusCode.UNAVAILABLE, "", "down", {}, ())
    slow = EffectdError(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED", "", {}, (), retry_delay=1.5
    )
    stale = EffectdError(
        grpc.StatusCode.FAILED_PRECONDITION, "STALE_ATTEMPT", "", {}, ()
    )
    assert [policy.wait(n, down, 0.0, 1.0) for n in (1, 2, 3)] == [0.2, 0.4, 0.5]
    assert policy.wait(1, down, 0.0, 0.0) == 0.1
    assert policy.wait(1, slow, 0.0, 0.0) == 1.5
    assert policy.wait(1, slow, 2.0, 0.0) is None
    assert policy.wait(5, down, 0.0, 0.0) is None
    assert policy.wait(1, stale, 0.0, 0.0) is None
