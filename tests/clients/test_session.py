"""The client's ledger session stream: answers reach their callers in any
order, a deadline cancels the message, a broken stream leaves an outcome
unknown (never failed, never sent again) and is opened anew, a daemon that
does not serve it is asked by unary calls, and close leaves no thread behind.

The daemon is real; the flaky proxy in front of it serves the session by
forwarding each message as its unary RPC, and fails on cue (see
`tests.clients.flaky_proxy`)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

import effectd_client
from effectd_client import (
    AsyncClient,
    CallInProgress,
    Client,
    EffectdError,
    ReconciliationNeeded,
    RecordingRetry,
    ResultNotRecorded,
    Run,
    State,
)
from effectd_client import _requests as req
from effectd_client import _session_wire as wire
from effectd_client._frames_wire import TRANSPORT_ENV
from effectd_client._session import Session
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.clients import sessions
from tests.clients.flaky_proxy import Fault, FlakyProxy, flaky_proxy
from tests.clients.sessions import all_again, prepare_at_once

FAST = RecordingRetry(attempts=3, deadline=20.0, initial_backoff=0.01)
LOST = Fault(grpc.StatusCode.UNAVAILABLE, lost=True)
BROKEN = Fault(broken=True)
THREADS = 16


@pytest.fixture(autouse=True)
def _the_grpc_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """This module tests the gRPC stream: a client that reaches a daemon
    directly keeps it (`tests/clients/test_frames_session.py` tests the
    framed transport)."""
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")


@pytest.fixture
def proxy(daemon: RunningDaemon) -> Iterator[FlakyProxy]:
    with flaky_proxy(daemon.target) as p:
        yield p


@pytest.fixture
def via(proxy: FlakyProxy) -> Iterator[Client]:
    with Client(proxy.target, recording_retry=FAST) as c:
        yield c


def session_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "effectd-session"]


# -- answers in any order ------------------------------------------------------


def test_many_threads_get_their_own_answers_out_of_order(
    via: Client, proxy: FlakyProxy
) -> None:
    """16 threads share one stream; the answers come back last-done first,
    and each thread gets the answer to its own message."""
    proxy.reorder(THREADS)
    got = prepare_at_once(via, THREADS)
    assert got == {f"c{i}": f"c{i}" for i in range(THREADS)}
    assert proxy.sessions == 1


def test_negative_control_answers_given_in_turn_reach_the_wrong_threads(
    via: Client, proxy: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that hands each answer to the oldest
    waiter instead of the one its id names."""

    def oldest(table: wire.InFlight[object], message_id: int) -> object:
        entries = table._entries
        return entries.pop(min(entries)) if entries else None

    monkeypatch.setattr(wire.InFlight, "answer", oldest)
    proxy.reorder(THREADS)
    got = prepare_at_once(via, THREADS)
    assert got != {f"c{i}": f"c{i}" for i in range(THREADS)}


def test_async_tasks_get_their_own_answers_out_of_order(proxy: FlakyProxy) -> None:
    """The same with 16 tasks of an AsyncClient."""
    proxy.reorder(THREADS)

    async def main() -> list[str]:
        async with AsyncClient(proxy.target) as c:
            answers = await asyncio.gather(
                *(c.prepare_tool("run-aio", f"c{i}", "t", {}) for i in range(THREADS))
            )
        return [p.call.call_id for p in answers]

    assert asyncio.run(main()) == [f"c{i}" for i in range(THREADS)]
    assert proxy.sessions == 1


# -- deadline and cancel -------------------------------------------------------


def stalled_get(proxy: FlakyProxy) -> EffectdError:
    """A GetToolCall the daemon never answers, from a client with a 0.2 s
    timeout; the stream then still serves the next call."""
    proxy.fail("GetToolCall", Fault(stall=True))
    with Client(proxy.target, timeout=0.2) as c:
        with pytest.raises(EffectdError) as raised:
            c.get_tool_call("run-t", "c")
        c.timeout = 30.0
        c.prepare_tool("run-t", "c", "t", {})
    return raised.value


def wait_for_cancels(proxy: FlakyProxy, seconds: float) -> list[int]:
    end = time.monotonic() + seconds
    while not proxy.cancels and time.monotonic() < end:
        time.sleep(0.01)
    return proxy.cancels


def test_a_message_past_its_deadline_is_cancelled(proxy: FlakyProxy) -> None:
    """The caller gets DEADLINE_EXCEEDED (an unknown outcome, as a unary
    call's) and the daemon is sent `cancel` for the message's id."""
    error = stalled_get(proxy)
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_for_cancels(proxy, 10) == [1]
    assert proxy.sessions == 1


def test_negative_control_without_cancel_the_daemon_hears_nothing(
    proxy: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that stops waiting silently."""
    monkeypatch.setattr(Session, "_cancel", lambda self, entry: None)
    stalled_get(proxy)
    assert wait_for_cancels(proxy, 0.5) == []


def test_an_async_message_past_its_deadline_is_cancelled(proxy: FlakyProxy) -> None:
    proxy.fail("GetToolCall", Fault(stall=True))

    async def main() -> EffectdError:
        async with AsyncClient(proxy.target, timeout=0.2) as c:
            with pytest.raises(EffectdError) as raised:
                await c.get_tool_call("run-t", "c")
            c.timeout = 30.0
            await c.prepare_tool("run-t", "c", "t", {})
        return raised.value

    assert asyncio.run(main()).code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_for_cancels(proxy, 10) == [1]


# -- a broken stream -----------------------------------------------------------


def send_once(client: Client, runs: list[str]) -> object:
    @Run(client, "run-b").tool("send_email")
    def send_email(to: str) -> str:
        runs.append(to)
        return f"sent to {to}"

    return send_email.at("mail")("a@b.c")


def test_a_start_whose_stream_broke_is_unknown_and_never_sent_again(
    via: Client, proxy: FlakyProxy
) -> None:
    """The daemon started the call, then the stream broke: the caller gets
    UNAVAILABLE saying it may have been applied, the message was not sent
    again, the tool never ran, and a repeat of the call does not run it."""
    proxy.fail("PrepareTool", LOST)
    runs: list[str] = []
    with pytest.raises(EffectdError) as raised:
        send_once(via, runs)
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert raised.value.metadata[wire.MAY_HAVE_BEEN_APPLIED] == "true"
    assert proxy.calls.count("PrepareTool") == 1
    with pytest.raises(CallInProgress):
        send_once(via, runs)
    assert runs == []
    assert proxy.sessions == 2  # the next call opened a new stream


def test_negative_control_a_session_that_sends_again_is_caught(
    via: Client, proxy: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that sends a message its broken
    stream had taken again."""

    monkeypatch.setattr(wire.InFlight, "broken", all_again)
    proxy.fail("PrepareTool", LOST)
    with pytest.raises(CallInProgress):
        send_once(via, [])
    assert proxy.calls.count("PrepareTool") == 2


def test_a_commit_on_a_broken_stream_is_unknown_never_failed(
    via: Client, proxy: FlakyProxy
) -> None:
    """Every try of the commit breaks its stream: the tool ran once, the
    caller gets ResultNotRecorded (an unknown outcome) whose cause says the
    commit may have been applied, the ledger holds no error result, and a
    repeat of the call does not run the tool again."""
    proxy.fail("CommitTool", *[BROKEN] * FAST.attempts)
    runs: list[str] = []
    with pytest.raises(ResultNotRecorded) as raised:
        send_once(via, runs)
    cause = raised.value.__cause__
    assert isinstance(cause, EffectdError)
    assert cause.code is grpc.StatusCode.UNAVAILABLE
    assert cause.metadata[wire.MAY_HAVE_BEEN_APPLIED] == "true"
    assert via.get_tool_call("run-b", "mail").state is State.UNKNOWN
    with pytest.raises(ReconciliationNeeded):
        send_once(via, runs)
    assert runs == ["a@b.c"]


def test_a_stream_broken_while_the_tool_runs_is_opened_again(
    via: Client, proxy: FlakyProxy
) -> None:
    """The stream breaks while the tool runs (nothing in flight): the commit
    goes on a new stream and is recorded; the tool ran once."""
    runs: list[str] = []

    @Run(via, "run-r", heartbeat_interval=0).tool("send_email")
    def send_email(to: str) -> str:
        runs.append(to)
        proxy.break_streams()
        return "sent"

    assert send_email.at("m")("x") == "sent"
    assert runs == ["x"]
    assert via.get_tool_call("run-r", "m").state is State.COMMITTED
    assert proxy.sessions == 2


# -- a daemon without the stream -----------------------------------------------


@pytest.fixture
def old_daemon(daemon: RunningDaemon) -> Iterator[FlakyProxy]:
    """A daemon older than the session stream: Session is UNIMPLEMENTED."""
    with flaky_proxy(daemon.target, session=False) as p:
        yield p


def test_a_daemon_without_the_stream_is_asked_by_unary_calls(
    old_daemon: FlakyProxy,
) -> None:
    """The first call finds the stream UNIMPLEMENTED and is asked again by
    its unary RPC; the client never opens a stream again."""
    with Client(old_daemon.target) as c:
        p = c.prepare_tool("run-o", "c", "t", {}, start=True)
        c.commit_tool("run-o", "c", p.call.attempt, {"ok": True})
        assert c.get_tool_call("run-o", "c").state is State.COMMITTED
    assert old_daemon.sessions == 1
    assert old_daemon.calls == ["PrepareTool", "CommitTool", "GetToolCall"]


def test_negative_control_without_the_fallback_an_old_daemon_fails(
    old_daemon: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that takes UNIMPLEMENTED for a
    broken stream."""
    monkeypatch.setattr(wire, "refused", lambda error: False)
    with Client(old_daemon.target) as c, pytest.raises(EffectdError):
        c.prepare_tool("run-o", "c", "t", {}, start=True)
    assert old_daemon.calls == []


def test_an_async_client_falls_back_to_unary_calls(old_daemon: FlakyProxy) -> None:
    """The same for the AsyncClient, whose write can race the daemon's
    UNIMPLEMENTED (grpc then says INTERNAL; the client asks again)."""

    async def main() -> None:
        async with AsyncClient(old_daemon.target) as c:
            await asyncio.gather(
                *(c.prepare_tool("run-o", f"c{i}", "t", {}) for i in range(4))
            )
            assert (await c.get_tool_call("run-o", "c0")).state is State.PREPARED

    for _ in range(3):  # new clients: a race lost and one won alike
        asyncio.run(main())
    assert old_daemon.calls.count("PrepareTool") == 12


# -- close ---------------------------------------------------------------------


def test_close_ends_the_stream_and_its_thread(proxy: FlakyProxy) -> None:
    """A session with its stream open closes without a thread left, and a
    call after close is refused at once (CANCELLED)."""
    before = session_threads()
    with grpc.insecure_channel(proxy.target) as channel:
        session = Session(channel, ())
        ask(session)
        assert len(session_threads()) == len(before) + 1
        session.close()
        assert session_threads() == before
        with pytest.raises(grpc.RpcError) as raised:
            session.call("GetToolCall", req.get_tool_call("", "r", "c"), 10.0)
    assert raised.value.code() is grpc.StatusCode.CANCELLED


def test_negative_control_a_close_that_leaves_the_stream_leaks_its_thread(
    proxy: FlakyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a close that does not end the stream."""
    before = session_threads()
    with grpc.insecure_channel(proxy.target) as channel:
        session = Session(channel, ())
        ask(session)
        with monkeypatch.context() as patched:
            patched.setattr(Session, "close", lambda self: None)
            session.close()
            assert session_threads() != before
        session.close()


def test_close_does_not_hang_when_the_daemon_is_gone(daemon: RunningDaemon) -> None:
    """The daemon goes away with a stream open: close returns, the thread
    ends."""
    before = session_threads()
    proxy = FlakyProxy(daemon.target)
    client = Client(proxy.target)
    client.prepare_tool("run-g", "c", "t", {})
    proxy.close()
    client.close()
    assert session_threads() == before


def threads_after_dropping(target: str, kept: list[Client] | None) -> list[str]:
    """Session threads left once a client with its stream open is dropped
    and collected (unless it is put in `kept`)."""
    before = session_threads()
    client = Client(target)
    client.prepare_tool("run-d", "c", "t", {})
    if kept is not None:
        kept.append(client)
    del client
    gc.collect()
    return [t.name for t in session_threads() if t not in before]


def test_a_client_dropped_without_close_leaves_no_thread(proxy: FlakyProxy) -> None:
    """A client nobody closes ends its stream and reader when collected."""
    assert threads_after_dropping(proxy.target, None) == []


def test_negative_control_a_client_still_referenced_keeps_its_thread(
    proxy: FlakyProxy,
) -> None:
    """The check above sees a client that was not dropped."""
    kept: list[Client] = []
    assert threads_after_dropping(proxy.target, kept) == ["effectd-session"]
    kept[0].close()


def test_an_async_close_awaits_its_reader(proxy: FlakyProxy) -> None:
    # The client's own tasks, not grpc.aio's: under load grpc may still be
    # finishing a cancelled call's internals when close returns.
    package = str(Path(effectd_client.__file__).parent)

    def ours(task: asyncio.Task[object]) -> bool:
        code = getattr(task.get_coro(), "cr_code", None)
        return code is not None and code.co_filename.startswith(package)

    async def main() -> set[asyncio.Task[object]]:
        c = AsyncClient(proxy.target)
        await c.prepare_tool("run-a", "c", "t", {})
        assert any(ours(t) for t in asyncio.all_tasks()), "no reader to await"
        await c.close()
        return {t for t in asyncio.all_tasks() if ours(t)}

    assert asyncio.run(main()) == set()


def ask(session: Session) -> None:
    """A GetToolCall of a call that does not exist, through `session`."""
    request = req.get_tool_call("", "run-x", "none")
    with pytest.raises(grpc.RpcError) as raised:
        session.call("GetToolCall", request, 10.0)
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND


# -- a daemon restart ----------------------------------------------------------


def ask_until_answered(client: Client, tries: int) -> bool:
    """GetToolCall until one is answered (the channel reconnects with
    backoff after a restart); whether one was, within `tries`. Every failure
    on the way says the daemon was not reached, or the time ran out."""
    codes = set()
    answered = False
    for _ in range(tries):
        try:
            client.get_tool_call("run-s", "c")
        except EffectdError as exc:
            codes.add(exc.code)
            time.sleep(0.1)
        else:
            answered = True
            break
    assert codes <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    return answered


def restart_under(
    client: Client, config: ServeConfig, clock: ManualClock, timeout: float
) -> bool:
    """Prepares a call, restarts the daemon, and asks for the call again
    (each try within `timeout`): whether it was answered over a stream (not
    by a unary call)."""
    with ExitStack() as first:
        first.enter_context(running_daemon(config, clock))
        client.prepare_tool("run-s", "c", "t", {})
    client.timeout = timeout
    with running_daemon(config, clock):
        answered = ask_until_answered(client, tries=30)
        session = client._session
        assert isinstance(session, Session)
        return answered and not session.unary and session._stream is not None


def test_the_first_call_after_a_daemon_restart_opens_a_new_stream(
    config: ServeConfig, clock: ManualClock
) -> None:
    """The stream dies with the daemon; the next call after its restart is
    answered over a new stream, not by unary calls."""
    with Client(f"unix:{config.socket_path}", timeout=30.0) as client:
        assert restart_under(client, config, clock, 1.0)


@pytest.mark.slow  # every try waits out its timeout
def test_negative_control_a_session_that_keeps_its_dead_stream_never_recovers(
    config: ServeConfig, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that goes on queueing on the stream
    that broke."""
    monkeypatch.setattr(Session, "_ended", lambda self, stream, error: None)
    with Client(f"unix:{config.socket_path}", timeout=30.0) as client:
        assert not restart_under(client, config, clock, 0.1)


# -- fork ----------------------------------------------------------------------


def child_state_after_fork(client: Client) -> int:
    """Forks with the client's stream open; the child exits 0 when its copy
    of the session has no stream, no message in flight and a free lock."""
    session = client._session
    assert isinstance(session, Session)
    pid = os.fork()
    if pid == 0:  # the child: look, never touch grpc, leave at once
        fresh = (
            session._stream is None
            and len(session._table) == 0
            and session._lock.acquire(blocking=False)
        )
        os._exit(0 if fresh else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_starts_with_an_empty_session(via: Client) -> None:
    """The child of a fork does not inherit the parent's stream, reader or
    waiters (they are the parent's), nor a lock a parent thread held."""
    via.prepare_tool("run-f", "c", "t", {})
    assert child_state_after_fork(via) == 0
    via.get_tool_call("run-f", "c")  # the parent's stream is untouched


def test_negative_control_without_the_fork_handler_the_child_inherits(
    via: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that keeps its state across a fork."""
    monkeypatch.setattr(Session, "_after_fork", lambda self: None)
    via.prepare_tool("run-f", "c", "t", {})
    assert child_state_after_fork(via) == 1


# -- a daemon without room for another stream ----------------------------------


def test_a_daemon_without_room_for_a_stream_gets_unary_calls(
    config: ServeConfig, clock: ManualClock
) -> None:
    """A stream refused CONCURRENCY_LIMITED served nothing: its messages are
    asked by unary calls (which hold a slot only while served)."""
    assert sessions.second_client_answers(config, clock)


def test_negative_control_a_full_daemons_refusal_as_a_broken_stream(
    config: ServeConfig, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that takes the refusal for a break."""
    monkeypatch.setattr(wire, "_NO_ROOM", frozenset())
    assert not sessions.second_client_answers(config, clock)
