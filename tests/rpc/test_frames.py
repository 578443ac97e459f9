"""The local framed transport (`sidecar.rpc.frames`, `--local-frames`): the
session's messages as length-prefixed frames on a Unix socket, served
through the same gate, boundary and session as the gRPC stream. Each frame
is answered byte for byte as its unary RPC; the hello is authenticated as
the stream's metadata; a hello of another version, a frame that is not a
request, one over the size limit, id 0 and a peer of another user end the
session; a stopping daemon answers what is in flight, then ends it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from google.rpc import status_pb2 as pb_status

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.rpc import frames as frames_module
from sidecar.rpc.frames import frames_path
from sidecar.testing import RunningDaemon, running_daemon
from tests.auth.support import AGENT_A, authenticated_daemon
from tests.rpc.sessions import HeldDaemon, Holds, message, prepare
from tests.rpc.support import decode_status
from tests.rpc.test_session import _script, _unary

_HEADER = struct.Struct(">I")


class Frames:
    """A client of the framed transport on a blocking socket."""

    def __init__(self, running: RunningDaemon) -> None:
        path = frames_path(Path(running.target.removeprefix("unix:")))
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self._file = self.sock.makefile("rb")

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(_HEADER.pack(len(data)) + data)

    def hello(self, authorization: str = "", version: int = 1) -> None:
        hello = pb.SessionHello(version=version, authorization=authorization)
        self.send_bytes(hello.SerializeToString())

    def send(self, request: pb.SessionRequest) -> None:
        self.send_bytes(request.SerializeToString())

    def receive(self) -> pb.SessionResponse | None:
        """The next answer; None once the daemon closed."""
        header = self._file.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack(header)
        return pb.SessionResponse.FromString(self._file.read(size))

    def half_close(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._file.close()
        self.sock.close()


@contextmanager
def framed(running: RunningDaemon) -> Iterator[Frames]:
    client = Frames(running)
    try:
        yield client
    finally:
        client.close()


def _config(data_dir: Path) -> ServeConfig:
    return ServeConfig(data_dir=data_dir, init=True, local_frames=True)


def _ending(client: Frames) -> pb_status.Status:
    """The error the session ended with; the daemon then closes."""
    got = client.receive()
    assert got is not None
    assert got.id == 0
    assert got.WhichOneof("response") == "error"
    assert client.receive() is None
    return got.error


def test_each_frame_is_answered_as_its_unary_rpc(short_tmp: Path) -> None:
    """The script of the session stream's test, on two daemons in the same
    state: unary answers and framed answers are the same bytes."""
    unary_cfg = ServeConfig(data_dir=short_tmp / "unary", init=True)
    with (
        running_daemon(unary_cfg, ManualClock()) as u,
        running_daemon(_config(short_tmp / "frames"), ManualClock()) as f,
        grpc.insecure_channel(u.target) as uch,
        framed(f) as client,
    ):
        client.hello()
        for i, (method, request) in enumerate(_script()):
            unary = _unary(uch, method, request)
            client.send(message(i + 1, request))
            got = client.receive()
            assert got is not None
            assert got.id == i + 1
            which = got.WhichOneof("response")
            answered = getattr(got, str(which)).SerializeToString(deterministic=True)
            framed_bytes = (b"error:" if which == "error" else b"answer:") + answered
            assert framed_bytes == unary, f"step {i}: {method}"
        client.half_close()
        assert client.receive() is None  # every message answered: closed


def test_no_socket_with_no_local_frames_not_even_one_left_by_a_crash(
    short_tmp: Path,
) -> None:
    """A daemon started with --no-local-frames removes the framed socket a
    crashed one left, so that clients find none and use gRPC."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True, local_frames=False)
    left = frames_path(config.socket_path)
    left.parent.mkdir(mode=0o700, parents=True)
    left.write_bytes(b"")
    with running_daemon(config):
        assert not left.exists()


def test_a_socket_path_too_long_is_served_by_grpc_alone(tmp_path: Path) -> None:
    """The framed socket's name is 7 bytes longer than the gRPC one's: one
    that fits leaves the other past a Unix socket's 107 bytes. The daemon
    serves gRPC and warns."""
    filler = 105 - len(str(tmp_path)) - len("//effectd.sock")
    grpc_socket = tmp_path / ("s" * filler) / "effectd.sock"
    grpc_socket.parent.mkdir(mode=0o700)
    assert len(str(grpc_socket)) <= 107 < len(str(frames_path(grpc_socket)))
    config = ServeConfig(data_dir=tmp_path / "data", init=True, socket=grpc_socket)
    with running_daemon(config) as running:
        assert not frames_path(grpc_socket).exists()
        _assert_grpc_serves(running)


def test_the_hello_is_authenticated_as_the_streams_metadata(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data", local_frames=True) as (daemon, _):
        with framed(daemon) as client:
            client.hello()  # no token: refused before any message is read
            assert decode_status(_ending(client)).reason == "UNAUTHENTICATED"
        with framed(daemon) as client:
            client.hello(authorization=f"Bearer {AGENT_A}")
            client.send(message(1, prepare("x")))
            got = client.receive()
            assert got is not None
            assert got.prepare_tool.decision == pb.DECISION_EXECUTE
            assert got.prepare_tool.call.ref.namespace == "a"


@pytest.mark.parametrize(
    "first",
    [
        pb.SessionHello(version=2).SerializeToString(),
        b"\xff\xff not a hello",
    ],
    ids=["another-version", "garbage"],
)
def test_a_hello_not_understood_ends_the_session(short_tmp: Path, first: bytes) -> None:
    with running_daemon(_config(short_tmp / "data")) as running, framed(running) as c:
        c.send_bytes(first)
        assert _ending(c).code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        _assert_serving(running)


@pytest.mark.parametrize("bad", ["garbage", "id-0", "too-big"])
def test_a_frame_that_is_not_a_request_ends_the_session(
    short_tmp: Path, bad: str
) -> None:
    """After the messages before it are answered; the daemon serves on."""
    config = dataclasses.replace(_config(short_tmp / "data"))
    with running_daemon(config) as running, framed(running) as client:
        client.hello()
        client.send(message(1, prepare("before")))
        if bad == "garbage":
            client.send_bytes(b"\xff\xff\xff")
        elif bad == "id-0":
            client.send(message(0, prepare("zero")))
        else:
            limit = config.server_limits.max_message_bytes
            client.sock.sendall(_HEADER.pack(limit + 1))
        answered = client.receive()
        assert answered is not None
        assert answered.id == 1
        assert answered.prepare_tool.decision == pb.DECISION_EXECUTE
        ending = _ending(client)
        assert ending.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        _assert_serving(running)


def test_a_peer_of_another_user_is_closed_on_unanswered(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frames_module, "_allowed", lambda uid: False)
    with running_daemon(_config(short_tmp / "data")) as running:
        with framed(running) as c:
            assert c.receive() is None  # closed before its hello is read
        monkeypatch.undo()
        _assert_serving(running)
    assert frames_module._allowed(os.geteuid())


def test_a_stopping_daemon_answers_what_it_has_then_ends_the_session(
    config: ServeConfig,
) -> None:
    """As the stream: a message read once the daemon began to stop is
    refused SHUTTING_DOWN, the one held is answered when let go, and the
    session then ends UNAVAILABLE/SHUTTING_DOWN."""
    holds = Holds()
    cfg = dataclasses.replace(config, local_frames=True, grace_seconds=30)
    with running_daemon(cfg, daemon=HeldDaemon(cfg, holds)) as running:
        services = running.daemon.services
        assert services is not None
        with framed(running) as client:
            client.hello()
            client.send(message(1, prepare("hold-1")))
            holds.wait_until(lambda h: h.now == 1)
            stop = asyncio.run_coroutine_threadsafe(running.daemon.stop(), running.loop)
            _eventually(lambda: services.draining.begun)
            client.send(message(2, prepare("c2")))
            late = client.receive()
            assert late is not None
            assert (late.id, decode_status(late.error).reason) == (2, "SHUTTING_DOWN")
            holds.release()
            first = client.receive()
            assert first is not None
            assert (first.id, first.prepare_tool.decision) == (
                1,
                pb.DECISION_EXECUTE,
            )
            ending = decode_status(_ending(client))
            assert (ending.code, ending.reason) == (
                grpc.StatusCode.UNAVAILABLE,
                "SHUTTING_DOWN",
            )
            stop.result(timeout=30)


def _eventually(check: Any) -> None:
    for _ in range(300):
        if check():
            return
        time.sleep(0.01)
    raise AssertionError("never")


def _assert_grpc_serves(running: RunningDaemon) -> None:
    with grpc.insecure_channel(running.target) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)


def _assert_serving(running: RunningDaemon) -> None:
    """A new session is served."""
    with framed(running) as client:
        client.hello()
        client.send(message(7, prepare("after")))
        got: Any = client.receive()
        assert got is not None
        assert got.id == 7
        assert got.prepare_tool.decision == pb.DECISION_EXECUTE


def test_a_message_cancelled_in_the_frame_after_it_is_answered(
    short_tmp: Path,
) -> None:
    """A request and its cancel in one read: the daemon cancels a task that
    has not started yet. The message is still answered (CANCELLED, or its
    answer), its room given back, and the session ends once the client
    half-closes (before: the task never ran its own cleanup, the message
    stayed in flight, and the session hung until the daemon stopped)."""
    with running_daemon(_config(short_tmp / "data"), ManualClock()) as running:
        with framed(running) as client:
            client.sock.settimeout(5)
            hello = pb.SessionHello(version=1).SerializeToString()
            frames = [
                hello,
                message(1, prepare("c1", start=False)).SerializeToString(),
                pb.SessionRequest(id=1, cancel=pb.SessionCancel()).SerializeToString(),
                message(2, prepare("c2", start=False)).SerializeToString(),
            ]
            client.sock.sendall(b"".join(_HEADER.pack(len(f)) + f for f in frames))
            client.half_close()
            answered = {}
            while (got := client.receive()) is not None:
                answered[got.id] = got.WhichOneof("response")
        assert answered.keys() == {1, 2}, answered
        assert answered[2] == "prepare_tool"
