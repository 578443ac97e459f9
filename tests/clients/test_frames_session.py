"""The sync client's session on the daemon's framed transport
(`effectd_client._frames`): chosen for a `unix:` target whose daemon serves
the framed socket, unless `EFFECTD_TRANSPORT=grpc`; answers reach their own
callers whichever thread reads; a message past its deadline is cancelled on
the daemon; a connection cut with a start in flight leaves it unknown, never
sent again, and the next call opens a new one; the token is the hello's; a
fork starts with an empty session; close leaves a message sent unknown and
no connection behind.

The daemon is real; messages are held in flight by `tests.rpc.sessions`'s
`HeldDaemon` (a prepare of a call whose id starts with `hold`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from google.rpc import status_pb2

from effectd_client import Client, EffectdError
from effectd_client import _frames as frames_module
from effectd_client import _frames_wire as frames_wire
from effectd_client import _session_wire as wire
from effectd_client._frames import FramesSession
from effectd_client._frames_wire import TRANSPORT_ENV
from effectd_client._session import Session
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.auth.support import AGENT_A, authenticated_daemon
from tests.clients import sessions
from tests.clients.sessions import (
    cut_frames,
    no_cancel_is_caught,
    prepare_at_once,
    sent_again_is_caught,
    unknown_and_sent_once,
)
from tests.rpc.sessions import Holds

THREADS = 16


def _framed(client: Client) -> FramesSession:
    session = client._session
    assert isinstance(session, FramesSession)
    return session


# -- which transport -----------------------------------------------------------


def test_a_daemon_on_this_host_is_asked_through_its_framed_socket(
    daemon: RunningDaemon,
) -> None:
    with Client(daemon.target) as client:
        _framed(client)
        p = client.prepare_tool("run", "c", "pay", {"n": 1}, start=True)
        client.commit_tool("run", "c", p.call.attempt, {"ok": 1}, acknowledge=True)
        again = client.prepare_tool("run", "c", "pay", {"n": 1}, start=True)
        assert again.decision.name == "RETURN_RESULT"


def test_effectd_transport_grpc_keeps_the_stream(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")
    with Client(daemon.target) as client:
        assert isinstance(client._session, Session)


def test_a_daemon_without_the_framed_socket_is_asked_by_the_stream(
    short_tmp: Path,
) -> None:
    config = ServeConfig(data_dir=short_tmp / "data", init=True, local_frames=False)
    with running_daemon(config) as running, Client(running.target) as client:
        assert isinstance(client._session, Session)
        assert client.prepare_tool("run", "c", "pay", {}).call.call_id == "c"


def test_the_token_goes_in_the_hello(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data") as (daemon, _):
        with Client(daemon.target, token=AGENT_A) as client:
            _framed(client)
            got = client.prepare_tool("run", "c", "pay", {})
            assert got.call.namespace == "a"
        with (
            Client(daemon.target, token="not-a-token") as client,
            pytest.raises(EffectdError) as info,
        ):
            client.prepare_tool("run", "c", "pay", {})
        assert info.value.reason == "UNAUTHENTICATED"


# -- answers in any order ------------------------------------------------------


def test_many_threads_get_their_own_answers(daemon: RunningDaemon) -> None:
    with Client(daemon.target) as client:
        _framed(client)
        got = prepare_at_once(client, THREADS)
    assert got == {f"c{i}": f"c{i}" for i in range(THREADS)}


def test_negative_control_answers_given_in_turn_reach_the_wrong_threads(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that hands each answer to the newest
    waiter instead of the one its id names."""

    def newest(table: wire.InFlight[object], message_id: int) -> object:
        entries = table._entries
        return entries.pop(max(entries)) if entries else None

    monkeypatch.setattr(wire.InFlight, "answer", newest)
    with Client(daemon.target) as client:
        got = prepare_at_once(client, THREADS)
    assert got != {f"c{i}": f"c{i}" for i in range(THREADS)}


# -- deadlines -----------------------------------------------------------------


def _past_its_deadline(held: RunningDaemon) -> None:
    with Client(held.target, timeout=0.3) as client:
        _framed(client)
        with pytest.raises(EffectdError) as info:
            client.prepare_tool("run", "hold-1", "pay", {})
        assert info.value.code.name == "DEADLINE_EXCEEDED"
        # The session serves on.
        assert client.prepare_tool("run", "after", "pay", {}).call.call_id == "after"


@pytest.mark.usefixtures("no_deadline_sent")
def test_a_message_past_its_deadline_is_cancelled(
    held: RunningDaemon, holds: Holds
) -> None:
    _past_its_deadline(held)
    holds.wait_until(lambda h: h.cut == 1)


@pytest.mark.usefixtures("no_deadline_sent")
def test_negative_control_without_cancel_the_daemon_hears_nothing(
    held: RunningDaemon, holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_cancel_is_caught(lambda: _past_its_deadline(held), holds, monkeypatch)


# -- a connection cut ----------------------------------------------------------


def _start_cut(held: RunningDaemon, holds: Holds) -> list[EffectdError]:
    """A start held on the daemon, its connection cut: what it raised."""
    failed: list[EffectdError] = []
    with Client(held.target) as client:

        def start() -> None:
            try:
                client.prepare_tool("run", "hold-1", "pay", {}, start=True)
            except EffectdError as exc:
                failed.append(exc)

        thread = threading.Thread(target=start)
        thread.start()
        holds.wait_until(lambda h: h.now == 1)
        cut_frames(held)
        holds.wait_until(lambda h: h.now == 0)
        holds.release()
        thread.join(timeout=30)
        # A new connection serves the next call.
        assert client.prepare_tool("run", "next", "pay", {}).call.call_id == "next"
    return failed


def test_a_start_whose_connection_was_cut_is_unknown_and_never_sent_again(
    held: RunningDaemon, holds: Holds
) -> None:
    unknown_and_sent_once(_start_cut(held, holds), holds)


def test_negative_control_a_session_that_sends_again_is_caught(
    held: RunningDaemon, holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent_again_is_caught(lambda: _start_cut(held, holds), holds, monkeypatch)


# -- a message over the limit -----------------------------------------------------


def _over_the_limit(daemon: RunningDaemon) -> tuple[EffectdError, bool]:
    """A prepare over the client's limit: what it raised, and whether its
    connection served the next call."""
    with Client(daemon.target, reconnect_wait=0) as client:
        client.prepare_tool("run", "before", "t", {})
        conn = _framed(client)._conn
        with pytest.raises(EffectdError) as info:
            client.prepare_tool("run", "big", "t", sessions.BIG)
        client.prepare_tool("run", "after", "t", {})
        return info.value, _framed(client)._conn is conn


def test_a_message_over_the_limit_is_refused_before_it_is_sent(
    daemon: RunningDaemon,
) -> None:
    sessions.refused_before_it_was_sent(*_over_the_limit(daemon))


def test_negative_control_a_message_over_the_limit_sent_is_caught(
    daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions.sent_over_the_limit_is_caught(
        frames_module, lambda: _over_the_limit(daemon), monkeypatch
    )


# -- fork and close --------------------------------------------------------------


def test_a_forked_child_starts_with_an_empty_session(daemon: RunningDaemon) -> None:
    with Client(daemon.target) as client:
        client.prepare_tool("run", "parent", "pay", {})
        pid = os.fork()
        if pid == 0:  # the child: its own connection
            code = 1
            try:
                got = client.prepare_tool("run", "child", "pay", {})
                code = 0 if got.call.call_id == "child" else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.prepare_tool("run", "parent-2", "pay", {}).call.call_id


def test_close_leaves_what_was_sent_unknown_and_no_connection(
    held: RunningDaemon, holds: Holds
) -> None:
    client = Client(held.target)
    session = _framed(client)
    failed: list[EffectdError] = []

    def wait() -> None:
        try:
            client.prepare_tool("run", "hold-1", "pay", {})
        except EffectdError as exc:
            failed.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    holds.wait_until(lambda h: h.now == 1)
    client.close()
    thread.join(timeout=30)
    # Sent: its outcome unknown, as a broken connection's.
    assert [
        (e.code.name, e.metadata.get(wire.MAY_HAVE_BEEN_APPLIED)) for e in failed
    ] == [("UNAVAILABLE", "true")]
    assert session._conn is None


# -- a daemon without the framed socket ------------------------------------------


def _across_a_restart_without_frames(short_tmp: Path) -> str:
    """A client on a daemon serving the framed socket, then on the same
    socket's daemon restarted with --no-local-frames: the call id its
    next prepare got back."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True)
    with running_daemon(config) as running:
        client = Client(running.target, reconnect_wait=0)
        _framed(client)
        client.prepare_tool("run", "before", "pay", {})
    try:
        grpc_alone = dataclasses.replace(config, local_frames=False)
        with running_daemon(grpc_alone):
            return client.prepare_tool("run", "after", "pay", {}).call.call_id
    finally:
        client.close()


def test_a_daemon_restarted_without_the_framed_socket_is_asked_by_unary_calls(
    short_tmp: Path,
) -> None:
    assert _across_a_restart_without_frames(short_tmp) == "after"


def test_negative_control_a_session_only_framed_finds_no_daemon(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that takes a daemon serving gRPC alone
    for one that is away."""
    monkeypatch.setattr(frames_module, "_grpc_alone", lambda grpc_socket: False)
    with pytest.raises(EffectdError) as info:
        _across_a_restart_without_frames(short_tmp)
    assert info.value.code.name == "UNAVAILABLE"


# -- the socket itself -------------------------------------------------------------


def test_a_readers_wait_does_not_cut_another_threads_send_short() -> None:
    """A caller waits for an answer with a short deadline while another
    sends more than the socket holds: the send waits for the daemon to read,
    whatever the wait's deadline (a timeout set on the socket for the wait
    would cut the send short, and the connection with it)."""
    ours, daemons = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, daemons:
        conn = frames_module._Conn(ours, 8 << 20)
        big = pb.SessionRequest(
            id=1,
            prepare_tool=pb.PrepareToolRequest(input=pb.Payload(raw=b"x" * (4 << 20))),
        )
        with pytest.raises(TimeoutError):
            conn.receive(0.05)  # nothing comes
        sent: list[BaseException | None] = []

        def send() -> None:
            try:
                conn.send(frames_wire.frame(big))
                sent.append(None)
            except BaseException as exc:
                sent.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        with pytest.raises(TimeoutError):
            conn.receive(0.05)  # a wait while the send is blocked
        threading.Event().wait(0.3)  # the daemon is slow to read
        daemons.settimeout(2.0)
        received = 0
        with contextlib.suppress(TimeoutError):  # a send cut short: no more
            while received < big.ByteSize() + 4:
                received += len(daemons.recv(1 << 20))
        sender.join(timeout=30)
        assert sent == [None]
        assert received == big.ByteSize() + 4


def _refused_before_the_request_was_written(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> BaseException:
    """A daemon (a script) that reads the hello, ends the session
    UNAUTHENTICATED and closes, before the client writes its request: the
    error the request's call raises."""
    grpc_socket = short_tmp / "effectd.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(frames_wire.frames_of(str(grpc_socket)))
    listener.listen(1)
    closed = threading.Event()

    def daemon() -> None:
        conn, _ = listener.accept()
        with conn:
            listener.close()  # no second connection
            (size,) = frames_wire.HEADER.unpack(conn.recv(4, socket.MSG_WAITALL))
            conn.recv(size, socket.MSG_WAITALL)  # the hello
            refusal = status_pb2.Status(code=16, message="an unknown token")
            conn.sendall(frames_wire.frame(pb.SessionResponse(id=0, error=refusal)))
        closed.set()

    writes = frames_module._Conn.send

    def write_after_the_close(conn: frames_module._Conn, data: bytes) -> None:
        if not getattr(conn, "hello_sent", False):
            conn.hello_sent = True  # type: ignore[attr-defined]
        else:
            assert closed.wait(10)
        writes(conn, data)

    monkeypatch.setattr(frames_module._Conn, "send", write_after_the_close)
    server = threading.Thread(target=daemon)
    server.start()
    session = FramesSession(str(grpc_socket), (("authorization", "Bearer x"),), 1 << 20)
    try:
        session.call("GetToolCall", pb.GetToolCallRequest(), 10.0)
    except BaseException as exc:  # what the call raised is the result
        return exc
    finally:
        session.close()
        server.join(10)
    raise AssertionError("the call was answered")


def test_a_refusal_sent_before_a_write_failed_is_read(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's write fails (the daemon had closed), but the status the
    daemon ended the session with is in the socket: the call is refused
    with it, not failed as a connection that broke (which sent the request
    again, found no daemon, and waited for one)."""
    error = _refused_before_the_request_was_written(short_tmp, monkeypatch)
    assert isinstance(error, wire.SessionRpcError), repr(error)
    assert error.code() is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    "frame",
    [
        frames_wire.HEADER.pack((1 << 20) + 1),  # over the client's limit
        frames_wire.HEADER.pack(3) + b"\xff\xff\xff",  # not a SessionResponse
    ],
    ids=["over-the-limit", "garbled"],
)
def test_a_frame_the_client_cannot_take_ends_the_connection(frame: bytes) -> None:
    """Either is a broken connection (ValueError, which the reader takes as
    its end), never an exception of another kind out of a caller's wait."""
    ours, daemons = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, daemons:
        daemons.sendall(frame)
        with pytest.raises(ValueError, match=r"over the limit|not a SessionResponse"):
            frames_module._Conn(ours, 1 << 20).receive(5.0)


def test_a_daemon_without_room_for_a_session_gets_unary_calls(
    config: ServeConfig, clock: ManualClock
) -> None:
    """On the framed transport too: a session refused CONCURRENCY_LIMITED
    served nothing; its messages are asked by unary calls."""
    assert sessions.second_client_answers(config, clock)


def test_negative_control_a_full_daemons_refusal_as_a_broken_session(
    config: ServeConfig, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above sees a session that takes the refusal for a break."""
    monkeypatch.setattr(wire, "_NO_ROOM", frozenset())
    assert not sessions.second_client_answers(config, clock)
