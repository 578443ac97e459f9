"""The asyncio client's session on the daemon's framed transport
(`effectd_client._frames_aio`): chosen for a `unix:` target whose daemon
serves the framed socket, unless `EFFECTD_TRANSPORT=grpc`; answers reach
their own tasks; a bad token is refused as a unary call is; a message past
its deadline, or whose task is cancelled, is cancelled on the daemon and
leaves nothing behind; a connection cut with a start in flight leaves it
unknown, never sent again; a daemon away leaves a message not sent, sent
once it is back; a daemon serving gRPC alone is asked by unary calls; close
leaves a message sent unknown and no connection or task behind.

A real daemon answers, in this process; `tests.rpc.sessions.HeldDaemon`
keeps in flight the prepare of a call whose id starts with `hold`."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import socket
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb

from effectd_client import AsyncClient, Decision, EffectdError, State, _frames_wire
from effectd_client import _frames_aio as frames_aio
from effectd_client import _requests as req
from effectd_client import _session_wire as wire
from effectd_client._frames_aio import AsyncFramesSession
from effectd_client._frames_wire import TRANSPORT_ENV
from effectd_client._reconnect import not_sent
from effectd_client._session_aio import AsyncSession
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.auth.support import AGENT_A, authenticated_daemon
from tests.clients import sessions
from tests.rpc.sessions import Holds

T = TypeVar("T")
TASKS = 16
# Every wait here is bounded by this many seconds.
BOUND = 60.0


def run(main: Coroutine[Any, Any, T]) -> T:
    """`main` on an event loop of its own, bounded."""

    async def bounded() -> T:
        return await asyncio.wait_for(main, BOUND)

    return asyncio.run(bounded())


def _framed(client: AsyncClient) -> AsyncFramesSession:
    session = client._session
    assert isinstance(session, AsyncFramesSession)
    return session


async def _until(holds: Holds, predicate: Callable[[Holds], bool]) -> None:
    await asyncio.to_thread(holds.wait_until, predicate)


# -- which transport -----------------------------------------------------------


def test_a_daemon_on_this_host_is_asked_through_its_framed_socket(
    daemon: RunningDaemon,
) -> None:
    async def main() -> Decision:
        async with AsyncClient(daemon.target) as client:
            _framed(client)
            p = await client.prepare_tool("run", "c", "pay", {"n": 1}, start=True)
            await client.commit_tool("run", "c", p.call.attempt, {"ok": 1})
            again = await client.prepare_tool("run", "c", "pay", {"n": 1}, start=True)
            return again.decision

    assert run(main()) is Decision.RETURN_RESULT


def test_effectd_transport_grpc_keeps_the_stream(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")

    async def main() -> None:
        async with AsyncClient(daemon.target) as client:
            assert isinstance(client._session, AsyncSession)
            await client.prepare_tool("run", "c", "pay", {})

    run(main())


def test_a_daemon_without_the_framed_socket_is_asked_by_the_stream(
    short_tmp: Path,
) -> None:
    config = ServeConfig(data_dir=short_tmp / "data", init=True, local_frames=False)

    async def main(target: str) -> str:
        async with AsyncClient(target) as client:
            assert isinstance(client._session, AsyncSession)
            return (await client.prepare_tool("run", "c", "pay", {})).call.call_id

    with running_daemon(config) as running:
        assert run(main(running.target)) == "c"


def _refusal(target: str, token: str, session: bool) -> EffectdError:
    async def main() -> EffectdError:
        async with AsyncClient(target, token=token, session=session) as client:
            with pytest.raises(EffectdError) as info:
                await client.prepare_tool("run", "c", "pay", {})
            return info.value

    return run(main())


def test_the_token_goes_in_the_hello_and_a_bad_one_is_refused_as_unary(
    short_tmp: Path,
) -> None:
    async def namespace(target: str) -> str:
        async with AsyncClient(target, token=AGENT_A) as client:
            _framed(client)
            return (await client.prepare_tool("run", "c", "pay", {})).call.namespace

    with authenticated_daemon(short_tmp / "data") as (daemon, _):
        assert run(namespace(daemon.target)) == "a"
        framed = _refusal(daemon.target, "not-a-token", session=True)
        unary = _refusal(daemon.target, "not-a-token", session=False)
    assert framed.reason == "UNAUTHENTICATED"
    assert (type(framed), framed.code, framed.reason, framed.message) == (
        type(unary),
        unary.code,
        unary.reason,
        unary.message,
    )


# -- answers in any order ------------------------------------------------------


async def _held_at_once(held: RunningDaemon, holds: Holds) -> dict[str, str]:
    """`TASKS` tasks prepare a held call each, all in flight at once, then
    released: the call id each got back."""
    async with AsyncClient(held.target) as client:
        _framed(client)
        calls = {
            f"hold-{i}": asyncio.ensure_future(
                client.prepare_tool("run-many", f"hold-{i}", "t", {"i": i})
            )
            for i in range(TASKS)
        }
        await _until(holds, lambda h: h.now == TASKS)
        holds.release()
        await asyncio.wait(calls.values())
    return {
        call_id: task.result().call.call_id
        for call_id, task in calls.items()
        if task.exception() is None
    }


def test_many_tasks_get_their_own_answers(held: RunningDaemon, holds: Holds) -> None:
    got = run(_held_at_once(held, holds))
    assert got == {f"hold-{i}": f"hold-{i}" for i in range(TASKS)}
    assert holds.most == TASKS


def test_negative_control_answers_handed_to_another_task_are_caught(
    held: RunningDaemon, holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that hands an answer to another
    waiting task than the one its id names."""
    monkeypatch.setattr(wire.InFlight, "answer", sessions.crossed)
    got = run(_held_at_once(held, holds))
    assert got != {f"hold-{i}": f"hold-{i}" for i in range(TASKS)}


# -- deadlines and cancellation ----------------------------------------------------


async def _past_its_deadline(held: RunningDaemon) -> int:
    """A held prepare past its deadline; the messages left in the table."""
    async with AsyncClient(held.target, timeout=0.3) as client:
        session = _framed(client)
        with pytest.raises(EffectdError) as info:
            await client.prepare_tool("run", "hold-1", "pay", {})
        assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        client.timeout = 30.0  # the session serves on
        assert (await client.prepare_tool("run", "after", "pay", {})).call.call_id
        return len(session._table)


@pytest.mark.usefixtures("no_deadline_sent")
def test_a_message_past_its_deadline_is_cancelled(
    held: RunningDaemon, holds: Holds
) -> None:
    assert run(_past_its_deadline(held)) == 0
    holds.wait_until(lambda h: h.cut == 1)


@pytest.mark.usefixtures("no_deadline_sent")
def test_negative_control_without_cancel_the_daemon_hears_nothing(
    held: RunningDaemon, holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    def past_it() -> int:
        return run(_past_its_deadline(held))

    sessions.no_cancel_is_caught(past_it, holds, monkeypatch)


async def _cancelled_task(held: RunningDaemon, holds: Holds) -> int:
    """A task cancelled with its prepare held: the messages left in the
    table."""
    async with AsyncClient(held.target) as client:
        session = _framed(client)
        task = asyncio.ensure_future(client.prepare_tool("run", "hold-1", "pay", {}))
        await _until(holds, lambda h: h.now == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return len(session._table)


@pytest.mark.usefixtures("no_deadline_sent")
def test_a_cancelled_task_cancels_its_message_and_leaves_nothing_behind(
    held: RunningDaemon, holds: Holds
) -> None:
    assert run(_cancelled_task(held, holds)) == 0
    holds.wait_until(lambda h: h.cut == 1)


@pytest.mark.usefixtures("no_deadline_sent")
def test_negative_control_a_session_that_keeps_a_cancelled_message_is_caught(
    held: RunningDaemon, holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks above see a session that forgets nothing of a cancelled
    task's message, and tells the daemon nothing."""
    monkeypatch.setattr(AsyncFramesSession, "_stop_waiting", lambda self, entry: False)
    assert run(_cancelled_task(held, holds)) == 1
    assert (holds.cut, holds.now) == (0, 1)


def test_tasks_cancelled_anywhere_leave_nothing_behind(daemon: RunningDaemon) -> None:
    """Tasks cancelled after a random number of steps of the event loop
    (while the connection opens, while their frame is written, while they
    wait): the others get their own answers, the table ends empty, and the
    session serves on."""
    seed = random.randrange(2**32)  # noqa: S311 - a test seed
    print(f"seed {seed}")
    rng = random.Random(seed)  # noqa: S311 - a test seed

    async def cancel_after(task: asyncio.Future[Any], steps: int) -> None:
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()

    async def main() -> None:
        async with AsyncClient(daemon.target) as client:
            session = _framed(client)
            calls = [
                asyncio.ensure_future(client.prepare_tool("run-r", f"c{i}", "t", {}))
                for i in range(2 * TASKS)
            ]
            cancels = [
                cancel_after(task, rng.randrange(12))
                for task in calls
                if rng.random() < 0.5
            ]
            await asyncio.gather(*cancels)
            await asyncio.wait(calls)
            for i, task in enumerate(calls):
                if not task.cancelled():
                    assert task.result().call.call_id == f"c{i}"
            assert len(session._table) == 0
            after = await client.prepare_tool("run-r", "after", "t", {})
            assert after.call.call_id == "after"

    run(main())


# -- a connection cut ----------------------------------------------------------


def _start_cut(held: RunningDaemon, holds: Holds) -> list[EffectdError]:
    """A start held on the daemon, its connection cut: what it raised."""

    async def main() -> list[EffectdError]:
        async with AsyncClient(held.target) as client:
            _framed(client)
            task = asyncio.ensure_future(
                client.prepare_tool("run", "hold-1", "pay", {}, start=True)
            )
            await _until(holds, lambda h: h.now == 1)
            sessions.cut_frames(held)
            await _until(holds, lambda h: h.now == 0)
            holds.release()
            await asyncio.wait([task])
            # A new connection serves the next call.
            assert (await client.prepare_tool("run", "next", "pay", {})).call.call_id
        error = task.exception()
        return [error] if isinstance(error, EffectdError) else []

    return run(main())


def test_a_start_whose_connection_was_cut_is_unknown_and_never_sent_again(
    held: RunningDaemon, holds: Holds
) -> None:
    sessions.unknown_and_sent_once(_start_cut(held, holds), holds)


def test_negative_control_a_session_that_sends_again_is_caught(
    held: RunningDaemon, holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions.sent_again_is_caught(lambda: _start_cut(held, holds), holds, monkeypatch)


def test_a_connection_closing_unseen_is_not_written_to(daemon: RunningDaemon) -> None:
    """A connection whose end its reader has not read yet: the next message
    goes on a new connection, and is answered."""

    async def main() -> None:
        async with AsyncClient(daemon.target) as client:
            session = _framed(client)
            await client.prepare_tool("run", "first", "pay", {})
            old = session._stream
            assert old is not None
            assert old.transport is not None
            old.transport.abort()  # its end is handled later
            assert (await client.prepare_tool("run", "c", "pay", {})).call.call_id
            assert session._stream is not old

    run(main())


# -- the daemon away ---------------------------------------------------------------


def test_a_daemon_away_leaves_the_message_not_sent_and_sent_once_back(
    config: ServeConfig,
) -> None:
    """Asked with the daemon away, a message found no connection: not sent
    (so the client waits); once the daemon is back, sent once."""

    async def main() -> tuple[EffectdError, Decision]:
        with ExitStack() as first, ExitStack() as second:
            daemon = await asyncio.to_thread(
                first.enter_context, running_daemon(config)
            )
            async with AsyncClient(daemon.target, reconnect_wait=BOUND) as client:
                session = _framed(client)
                await client.prepare_tool("run", "before", "t", {})
                await asyncio.to_thread(first.close)
                request = req.get_tool_call("", "run", "before")
                with pytest.raises(grpc.RpcError) as raised:
                    await session.call("GetToolCall", request, 10.0)
                waiting = asyncio.ensure_future(
                    client.prepare_tool("run", "c", "t", {}, start=True)
                )
                await asyncio.to_thread(second.enter_context, running_daemon(config))
                decision = (await waiting).decision
                call = await client.get_tool_call("run", "c")
                assert (call.state, call.attempt) == (State.STARTED, 1)
                assert isinstance(client._session, AsyncFramesSession)
        return EffectdError.from_rpc_error(raised.value), decision

    error, decision = run(main())
    assert error.metadata == {wire.MAY_HAVE_BEEN_APPLIED: "false"}
    assert not_sent(error)
    assert decision is Decision.EXECUTE


def _across_a_restart_without_frames(short_tmp: Path) -> str:
    """A client on a daemon serving the framed socket, then on the same
    socket's daemon restarted with --no-local-frames: the call id its next
    prepare got back."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True)

    async def main() -> str:
        with ExitStack() as first, ExitStack() as second:
            daemon = await asyncio.to_thread(
                first.enter_context, running_daemon(config)
            )
            async with AsyncClient(daemon.target, reconnect_wait=0) as client:
                _framed(client)
                await client.prepare_tool("run", "before", "pay", {})
                await asyncio.to_thread(first.close)
                grpc_alone = dataclasses.replace(config, local_frames=False)
                await asyncio.to_thread(
                    second.enter_context, running_daemon(grpc_alone)
                )
                after = await client.prepare_tool("run", "after", "pay", {})
                return after.call.call_id

    return run(main())


def test_a_daemon_back_without_the_framed_socket_gets_unary_calls(
    short_tmp: Path,
) -> None:
    assert _across_a_restart_without_frames(short_tmp) == "after"


async def _never_alone(grpc_socket: str) -> bool:
    return False


def test_negative_control_a_daemon_serving_grpc_alone_taken_for_one_away(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session that never asks whether the gRPC socket answers finds no
    daemon there: the check above sees it."""
    monkeypatch.setattr(frames_aio, "_grpc_alone", _never_alone)
    with pytest.raises(EffectdError) as info:
        _across_a_restart_without_frames(short_tmp)
    assert info.value.code is grpc.StatusCode.UNAVAILABLE


def test_the_framed_socket_is_tried_again_after_the_pause(
    config: ServeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked by unary calls while its daemon served gRPC alone, the session
    is framed again once the pause is over and the socket is back."""
    monkeypatch.setattr(_frames_wire, "NO_FRAMES_PAUSE", 0.0)
    grpc_alone = dataclasses.replace(config, local_frames=False)

    async def ask(client: AsyncClient, call_id: str) -> bool:
        await client.prepare_tool("run", call_id, "pay", {})
        return _framed(client)._stream is not None

    async def main() -> list[bool]:
        asked = []
        with ExitStack() as first:
            daemon = await asyncio.to_thread(
                first.enter_context, running_daemon(config)
            )
            async with AsyncClient(daemon.target, reconnect_wait=0) as client:
                for i, cfg in enumerate((grpc_alone, config)):
                    await asyncio.to_thread(first.close)
                    await asyncio.to_thread(first.enter_context, running_daemon(cfg))
                    asked.append(await ask(client, f"c{i}"))
        return asked

    assert run(main()) == [False, True]


# -- a message over the limit -----------------------------------------------------


def _over_the_limit(daemon: RunningDaemon) -> tuple[EffectdError, bool]:
    """A prepare over the client's limit: what it raised, and whether its
    connection served the next call."""

    async def main() -> tuple[EffectdError, bool]:
        async with AsyncClient(daemon.target, reconnect_wait=0) as client:
            await client.prepare_tool("run", "before", "t", {})
            conn = _framed(client)._stream
            with pytest.raises(EffectdError) as info:
                await client.prepare_tool("run", "big", "t", sessions.BIG)
            await client.prepare_tool("run", "after", "t", {})
            return info.value, _framed(client)._stream is conn

    return run(main())


def test_a_message_over_the_limit_is_refused_before_it_is_sent_as_unary(
    daemon: RunningDaemon,
) -> None:
    sessions.refused_before_it_was_sent(*_over_the_limit(daemon))

    async def unary() -> EffectdError:
        async with AsyncClient(daemon.target, session=False) as client:
            with pytest.raises(EffectdError) as info:
                await client.prepare_tool("run", "big", "t", sessions.BIG)
            return info.value

    sessions.refused_before_it_was_sent(run(unary()), True)


def test_negative_control_a_message_over_the_limit_sent_is_caught(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions.sent_over_the_limit_is_caught(
        frames_aio, lambda: _over_the_limit(daemon), monkeypatch
    )


# -- close ---------------------------------------------------------------------


def test_close_leaves_what_was_sent_unknown_and_nothing_behind(
    held: RunningDaemon, holds: Holds
) -> None:
    async def main() -> tuple[EffectdError, EffectdError]:
        client = AsyncClient(held.target)
        session = _framed(client)
        task = asyncio.ensure_future(client.prepare_tool("run", "hold-1", "pay", {}))
        await _until(holds, lambda h: h.now == 1)
        await client.close()
        await asyncio.wait([task])
        assert (session._stream, session._tasks) == (None, set())
        with pytest.raises(EffectdError) as after:
            await client.get_tool_call("run", "hold-1")
        error = task.exception()
        assert isinstance(error, EffectdError)
        return error, after.value

    sent, after = run(main())
    # Sent: its outcome unknown, as a broken connection's.
    assert (sent.code, sent.metadata.get(wire.MAY_HAVE_BEEN_APPLIED)) == (
        grpc.StatusCode.UNAVAILABLE,
        "true",
    )
    assert after.code is grpc.StatusCode.CANCELLED


def test_close_settles_the_tasks_still_opening_the_connection(
    daemon: RunningDaemon,
) -> None:
    """Tasks whose first message is still waiting for the connection to
    open, at close: each fails CANCELLED (not sent), none is left waiting,
    and the connection that opened meanwhile is closed at once."""

    async def main() -> list[grpc.StatusCode | None]:
        client = AsyncClient(daemon.target)
        session = _framed(client)
        calls = [
            asyncio.ensure_future(client.prepare_tool("run", f"c{i}", "t", {}))
            for i in range(4)
        ]
        await asyncio.sleep(0)  # the first task begins to open it
        await client.close()
        await asyncio.wait(calls)
        assert (session._stream, session._tasks, len(session._table)) == (
            None,
            set(),
            0,
        )
        errors = [task.exception() for task in calls]
        return [e.code if isinstance(e, EffectdError) else None for e in errors]

    assert run(main()) == [grpc.StatusCode.CANCELLED] * 4


# -- the frames, as they arrive ----------------------------------------------------


class _Transport(asyncio.Transport):
    """What a connection writes, and whether it was aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def _answer(message_id: int, call_id: str) -> bytes:
    call = pb.ToolCall(ref=pb.CallRef(run_id="run", call_id=call_id))
    response = pb.SessionResponse(
        id=message_id, get_tool_call=pb.GetToolCallResponse(call=call)
    )
    return _frames_wire.frame(response)


async def _taken(
    n: int, sock: socket.socket | None = None
) -> tuple[AsyncFramesSession, Any, list[Any]]:
    """A session with `n` GetToolCalls taken by a connection on `sock` (a
    fake transport when None): the session, the connection and the
    futures."""
    session = AsyncFramesSession("/nonexistent/effectd.sock", (), 1 << 20)
    loop = asyncio.get_running_loop()
    if sock is None:
        conn = frames_aio._Conn(session)
        conn.connection_made(_Transport())
    else:
        _, conn = await loop.create_unix_connection(
            lambda: frames_aio._Conn(session), sock=sock
        )
    futures = []
    for i in range(n):
        request = req.get_tool_call("", "run", f"c{i}")
        entry = session._table.add("GetToolCall", request, 10.0, loop.create_future())
        entry.stream, entry.sent = conn, True
        futures.append(entry.waiter)
    return session, conn, futures


@pytest.mark.parametrize("split", range(1, 40))
def test_answers_split_anywhere_reach_their_callers(split: int) -> None:
    """Three answers, in reverse order, arriving in pieces of `split` bytes
    (a frame over several reads, several frames in one)."""

    async def main() -> list[str]:
        _, conn, futures = await _taken(3)
        data = b"".join(_answer(i + 1, f"c{i}") for i in reversed(range(3)))
        for at in range(0, len(data), split):
            conn.data_received(data[at : at + split])
        return [f.result().get_tool_call.call.ref.call_id for f in futures]

    assert run(main()) == ["c0", "c1", "c2"]


def test_a_frame_that_does_not_parse_ends_the_connection() -> None:
    """What came whole before it is answered; the others fail as taken by
    a broken connection (outcome unknown); the connection is closed."""

    async def main() -> tuple[str, list[str | None], bool]:
        session, conn, futures = await _taken(3)
        garbage = _frames_wire.HEADER.pack(3) + b"\xff\xff\xff"
        conn.data_received(_answer(1, "c0") + garbage + _answer(2, "c1"))
        first = futures[0].result().get_tool_call.call.ref.call_id
        failed = [
            EffectdError.from_rpc_error(f.exception()).metadata.get(
                wire.MAY_HAVE_BEEN_APPLIED
            )
            for f in futures[1:]
        ]
        return first, failed, conn.dead and session._stream is None

    assert run(main()) == ("c0", ["true", "true"], True)


def test_a_frame_over_the_limit_ends_the_connection() -> None:
    """A frame longer than the client's limit is not waited for (nor held
    in memory): the messages taken fail as a broken connection's, outcome
    unknown, as gRPC's own "larger than max" leaves them."""

    async def main() -> tuple[list[str | None], bool]:
        _, conn, futures = await _taken(2)
        conn.data_received(_frames_wire.HEADER.pack((1 << 20) + 1) + b"x" * 64)
        failed = [
            EffectdError.from_rpc_error(f.exception()).metadata.get(
                wire.MAY_HAVE_BEEN_APPLIED
            )
            for f in futures
        ]
        return failed, conn.dead

    assert run(main()) == (["true", "true"], True)


def _answer_then_a_failed_write() -> list[str]:
    """The daemon answers one of two messages and closes; a write fails on
    the closed connection before the event loop read the answer (asyncio
    then ends the transport without reading on): what each caller got."""

    async def main() -> list[str]:
        ours, daemons = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with daemons:
            _, conn, futures = await _taken(2, ours)
            daemons.sendall(_answer(1, "c0"))
        conn.write(_frames_wire.frame(wire.cancel(2)))  # EPIPE, at once
        await asyncio.wait(futures)
        return [
            f.result().get_tool_call.call.ref.call_id
            if f.exception() is None
            else str(EffectdError.from_rpc_error(f.exception()).metadata)
            for f in futures
        ]

    return run(main())


def test_an_answer_before_a_failed_write_reaches_its_caller() -> None:
    assert _answer_then_a_failed_write() == ["c0", "{'mayHaveBeenApplied': 'true'}"]


def test_negative_control_a_connection_that_drops_what_it_did_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above sees a connection that leaves unread what the daemon
    sent before its end."""
    monkeypatch.setattr(frames_aio._Conn, "_drain", lambda self: None)
    assert _answer_then_a_failed_write()[0] != "c0"
