"""A request the client knows it did not send waits for the daemon and is
sent once it is back (sync and async clients, session stream and unary
calls); one that may have reached the daemon is never sent again that way;
the wait ends at the client's `reconnect_wait` or the call's deadline, and an
outage logs one warning.

The daemon is real and in this process (stopped, then started again on the
same data directory and socket); `tests/clients/test_daemon_restart.py` kills
a daemon process under running agents."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import grpc
import pytest

from effectd_client import (
    AsyncClient,
    Client,
    Decision,
    EffectdError,
    RecordingRetry,
    Run,
    State,
)
from effectd_client import _reconnect as reconnect
from effectd_client import _session_wire as wire
from effectd_client._reconnect import Outage, not_sent
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.clients.flaky_proxy import Fault, FlakyProxy, flaky_proxy
from tests.support.restarts import waits

CALLERS = 3
# Long enough for any daemon to start on a loaded machine; bounded.
PATIENT = 60.0
LOST = Fault(grpc.StatusCode.UNAVAILABLE, lost=True)
STOPPING = Fault(grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN")


def until(predicate: Callable[[], bool], what: str) -> None:
    """Polls `predicate`, at most `PATIENT` seconds."""
    end = time.monotonic() + PATIENT
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def away(config: ServeConfig) -> str:
    """The target of a daemon that is away: it served, then stopped."""
    with running_daemon(config) as daemon:
        return daemon.target


# -- sent once the daemon is back ------------------------------------------------


def test_requests_not_sent_are_sent_once_the_daemon_is_back(
    config: ServeConfig, session: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon goes away with the client's stream open; three threads
    start calls while it is away: each waits (one warning for the outage),
    and is sent, once, when the daemon is back on the same socket."""
    caplog.set_level(logging.WARNING, "effectd_client")
    with running_daemon(config) as first:
        client = Client(
            first.target, session=session, timeout=PATIENT, reconnect_wait=PATIENT
        )
        client.prepare_tool("run-back", "before", "t", {})
    decisions: dict[int, Decision] = {}

    def start(i: int) -> None:
        p = client.prepare_tool("run-back", f"c{i}", "t", {}, start=True)
        decisions[i] = p.decision

    callers = [threading.Thread(target=start, args=(i,)) for i in range(CALLERS)]
    with client:
        for caller in callers:
            caller.start()
        until(lambda: client._outage._waiting == CALLERS, "every call to wait")
        with running_daemon(config):
            for caller in callers:
                caller.join(PATIENT)
            assert decisions == dict.fromkeys(range(CALLERS), Decision.EXECUTE)
            for i in range(CALLERS):
                call = client.get_tool_call("run-back", f"c{i}")
                assert (call.state, call.attempt) == (State.STARTED, 1)
    assert len(waits(caplog)) == 1


def test_async_requests_not_sent_are_sent_once_the_daemon_is_back(
    config: ServeConfig, session: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The same for three tasks of an AsyncClient."""
    caplog.set_level(logging.WARNING, "effectd_client")

    async def main() -> list[Decision]:
        with ExitStack() as first, ExitStack() as second:
            daemon = await asyncio.to_thread(
                first.enter_context, running_daemon(config)
            )
            async with AsyncClient(
                daemon.target, session=session, timeout=PATIENT, reconnect_wait=PATIENT
            ) as c:
                await c.prepare_tool("run-aio", "before", "t", {})
                await asyncio.to_thread(first.close)
                calls = [
                    asyncio.ensure_future(
                        c.prepare_tool("run-aio", f"c{i}", "t", {}, start=True)
                    )
                    for i in range(CALLERS)
                ]
                for _ in range(int(PATIENT / 0.01)):
                    if c._outage._waiting == CALLERS:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.to_thread(second.enter_context, running_daemon(config))
                return [p.decision for p in await asyncio.gather(*calls)]

    assert asyncio.run(main()) == [Decision.EXECUTE] * CALLERS
    assert len(waits(caplog)) == 1


def test_negative_control_without_the_wait_the_call_fails_at_once(
    away: str, session: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The checks above see a client that does not wait (reconnect_wait=0):
    the call fails UNAVAILABLE, saying its request was not sent."""
    client = Client(away, session=session, reconnect_wait=0)
    with client, pytest.raises(EffectdError) as raised:
        client.prepare_tool("run-none", "c", "t", {}, start=True)
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert not_sent(raised.value)
    assert waits(caplog) == []


# -- the wait is bounded ---------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout", "wait"), [(PATIENT, 0.3), (0.3, PATIENT)], ids=["wait", "deadline"]
)
def test_a_daemon_that_stays_away_fails_the_call_when_the_wait_ends(
    away: str, session: bool, timeout: float, wait: float
) -> None:
    """Whichever comes first, the client's wait or the call's deadline, ends
    it: UNAVAILABLE, the daemon did not come back, the request not sent."""
    client = Client(away, session=session, timeout=timeout, reconnect_wait=wait)
    with client, pytest.raises(EffectdError) as raised:
        client.get_tool_call("run-gone", "c")
    error = raised.value
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert f"the daemon at {away} did not come back within" in error.message
    assert error.metadata == {wire.MAY_HAVE_BEEN_APPLIED: "false"}
    assert isinstance(error.__cause__, EffectdError)
    assert not_sent(error.__cause__)


def test_an_async_daemon_that_stays_away_fails_the_call_when_the_wait_ends(
    away: str, session: bool
) -> None:
    async def main() -> EffectdError:
        async with AsyncClient(away, session=session, reconnect_wait=0.3) as c:
            with pytest.raises(EffectdError) as raised:
                await c.get_tool_call("run-gone", "c")
        return raised.value

    error = asyncio.run(main())
    assert "did not come back within" in error.message
    assert error.metadata == {wire.MAY_HAVE_BEEN_APPLIED: "false"}


# -- never sent again when it may have been applied -------------------------------


@pytest.fixture
def proxy(daemon: RunningDaemon) -> Iterator[FlakyProxy]:
    with flaky_proxy(daemon.target) as p:
        yield p


def send_once(client: Client, runs: list[str]) -> object:
    @Run(client, "run-once", heartbeat_interval=0).tool("send_email")
    def send_email(to: str) -> str:
        runs.append(to)
        return f"sent to {to}"

    return send_email.at("mail")("a@b.c")


def sent_and_lost(
    proxy: FlakyProxy, session: bool, caplog: pytest.LogCaptureFixture
) -> tuple[object, list[str]]:
    """The daemon applies the prepare-and-start, and its answer is lost on
    the way (the stream, or the unary call, breaks): what the safe call
    raised (or returned) and what ran."""
    caplog.set_level(logging.WARNING, "effectd_client")
    proxy.fail("PrepareTool", LOST)
    runs: list[str] = []
    with Client(proxy.target, session=session, reconnect_wait=PATIENT) as c:
        try:
            got: object = send_once(c, runs)
        except Exception as exc:
            got = exc
    return got, runs


def test_a_request_that_may_have_been_applied_is_not_sent_again(
    proxy: FlakyProxy, session: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A start whose answer was lost fails UNAVAILABLE at once, its outcome
    unknown: the client neither waits nor sends it again, so the tool does
    not run, not as this attempt nor as a new one."""
    got, runs = sent_and_lost(proxy, session, caplog)
    assert isinstance(got, EffectdError)
    assert got.code is grpc.StatusCode.UNAVAILABLE
    assert not not_sent(got)
    assert proxy.calls.count("PrepareTool") == 1
    assert (runs, waits(caplog)) == ([], [])


def test_negative_control_a_client_that_sends_any_unavailable_again_is_caught(
    proxy: FlakyProxy,
    session: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above sees a client that takes every UNAVAILABLE for a
    request not sent: the start goes twice."""
    monkeypatch.setattr(
        reconnect, "not_sent", lambda e: e.code is grpc.StatusCode.UNAVAILABLE
    )
    got, _ = sent_and_lost(proxy, session, caplog)
    assert proxy.calls.count("PrepareTool") == 2
    assert not isinstance(got, EffectdError)  # IN_PROGRESS: CallInProgress


def test_a_daemon_stopping_before_it_served_the_request_is_waited_for(
    proxy: FlakyProxy, session: bool
) -> None:
    """SHUTTING_DOWN: the daemon turned the request away unserved; it is sent
    again (to the daemon that serves next) and the tool runs once."""
    proxy.fail("PrepareTool", STOPPING, STOPPING)
    runs: list[str] = []
    with Client(proxy.target, session=session, reconnect_wait=PATIENT) as c:
        assert send_once(c, runs) == "sent to a@b.c"
    assert proxy.calls.count("PrepareTool") == 3
    assert runs == ["a@b.c"]


# -- the rules, without a daemon ------------------------------------------------


def _error(
    code: grpc.StatusCode, reason: str = "", message: str = "", **metadata: str
) -> EffectdError:
    return EffectdError(code, reason, message, dict(metadata), ())


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
NO_CONNECTION = "failed to connect to all addresses; last error: connect failed"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # The session stream: broken before the message was sent, or not.
        (_error(UNAVAILABLE, mayHaveBeenApplied="false"), True),
        (_error(UNAVAILABLE, mayHaveBeenApplied="true"), False),
        # A unary call that found no connection; one whose connection broke.
        (_error(UNAVAILABLE, message=NO_CONNECTION), True),
        (_error(UNAVAILABLE, message="Stream removed (Socket closed)"), False),
        # The daemon: stopping before it served it; its store's commit.
        (_error(UNAVAILABLE, "SHUTTING_DOWN"), True),
        (_error(UNAVAILABLE, "STORAGE_UNAVAILABLE", mayHaveBeenApplied="false"), False),
        (_error(UNAVAILABLE, "STORAGE_UNAVAILABLE", mayHaveBeenApplied="true"), False),
        # A deadline: it may have been applied.
        (_error(grpc.StatusCode.DEADLINE_EXCEEDED, message=NO_CONNECTION), False),
    ],
)
def test_only_a_request_known_not_sent_is_sent_again(
    error: EffectdError, expected: bool
) -> None:
    assert not_sent(error) is expected


def test_an_outage_is_logged_once_until_a_request_gets_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three requests wait at once: one warning. Once one got through, the
    next wait is a new outage; so it is once the last one waiting gave up."""
    caplog.set_level(logging.WARNING, "effectd_client")
    outage = Outage("unix:/x.sock", 10.0)
    away = _error(UNAVAILABLE, message=NO_CONNECTION)

    def wait() -> reconnect.Waiting:
        return outage.waiting(away, time.monotonic(), 10.0)

    with ExitStack() as stack:
        for _ in range(CALLERS):
            stack.enter_context(wait())
        assert len(waits(caplog)) == 1
    with wait():
        assert len(waits(caplog)) == 2
    with pytest.raises(EffectdError), wait():
        raise away
    with wait():
        assert len(waits(caplog)) == 4


def test_a_request_that_may_have_been_sent_does_not_wait() -> None:
    outage = Outage("unix:/x.sock", 10.0)
    lost = _error(UNAVAILABLE, mayHaveBeenApplied="true")
    with pytest.raises(EffectdError) as raised:
        outage.waiting(lost, time.monotonic(), 10.0)
    assert raised.value is lost
    with pytest.raises(ValueError, match="reconnect_wait"):
        Outage("unix:/x.sock", -1.0)


def test_the_clients_backoffs_leave_the_global_random_alone() -> None:
    """The jitter of a wait for the daemon and of a recording retry comes
    from the OS: an application's (or a test's random search's) global
    `random` is never drawn from (fails before the fix: both drew from it,
    and a Hypothesis search saw its random source used behind its back)."""
    random.seed(7)
    before = random.getstate()
    away = _error(UNAVAILABLE, message=NO_CONNECTION)
    with Outage("unix:/x.sock", 10.0).waiting(away, time.monotonic(), 10.0) as w:
        w.pause()
    RecordingRetry(attempts=3).next_wait(1, away, 0.0)
    assert random.getstate() == before
