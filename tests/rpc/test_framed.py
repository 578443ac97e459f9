"""The framed local transport (`sidecar.rpc.framed`): the session stream's
messages over a plain Unix socket, into the same request boundary as gRPC.

Each rule of the boundary holds there as on the gRPC stream: a message is
answered exactly as its unary call (answers and refusals with the same
details), the hello's token is authenticated and the session authorized for
its roles, each message authorized for its own RPC and its namespace; the
peer must be the daemon's user; a frame over the message limit is refused
RESOURCE_EXHAUSTED; a hello that is none, a message that does not parse,
and random bytes end the connection, never the daemon, never INTERNAL.
"""

from __future__ import annotations

import os
import random
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc as pb_grpc

from sidecar.config import ServeConfig, ServerLimits
from sidecar.rpc import framed
from sidecar.testing import RunningDaemon, running_daemon
from tests.auth.support import AGENT_A, APPROVER_A, authenticated_daemon
from tests.rpc.sessions import message, prepare
from tests.rpc.support import Refusal, decode, decode_status

R = grpc.StatusCode
HEADER = struct.Struct(">I")


class Framed:
    """A raw framed connection, blocking, with a timeout on every read."""

    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buffer = b""

    def send(self, payload: bytes) -> None:
        self.sock.sendall(framed.frame(payload))

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def hello(self, token: str = "") -> pb.SessionResponse:
        self.send(framed.HELLO + token.encode())
        return self.read()

    def ask(self, *messages: pb.SessionRequest) -> dict[int, pb.SessionResponse]:
        for m in messages:
            self.send(m.SerializeToString())
        answers: dict[int, pb.SessionResponse] = {}
        while len(answers) < len(messages):
            answer = self.read()
            assert answer.id != 0, decode_status(answer.error)
            answers[answer.id] = answer
        return answers

    def read(self) -> pb.SessionResponse:
        """The next frame; raises EOFError once the daemon closed."""
        while True:
            if len(self._buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(self._buffer)
                if len(self._buffer) >= HEADER.size + size:
                    payload = self._buffer[HEADER.size : HEADER.size + size]
                    self._buffer = self._buffer[HEADER.size + size :]
                    return pb.SessionResponse.FromString(payload)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the daemon closed the connection")
            self._buffer += chunk

    def ended(self) -> Refusal:
        """The refusal the connection ended with; it is closed after it."""
        end = self.read()
        assert end.id == 0, end
        assert end.WhichOneof("response") == "error", end
        with pytest.raises(EOFError):
            self.read()
        return decode_status(end.error)

    def close(self) -> None:
        self.sock.close()


def path_of(daemon: RunningDaemon) -> Path:
    return framed.framed_path(Path(daemon.target.removeprefix("unix:")))


@contextmanager
def connected(daemon: RunningDaemon, token: str = "") -> Iterator[Framed]:
    conn = Framed(path_of(daemon))
    try:
        welcome = conn.hello(token)
        assert welcome.id == 0, welcome
        assert welcome.WhichOneof("response") is None, welcome
        yield conn
    finally:
        conn.close()


def still_serves(daemon: RunningDaemon) -> None:
    """A new connection is welcomed and answered."""
    with connected(daemon) as conn:
        got = conn.ask(
            message(1, pb.GetToolCallRequest(ref=pb.CallRef(run_id="r", call_id="x")))
        )
        assert decode_status(got[1].error).code is R.NOT_FOUND


@pytest.fixture
def served(config: ServeConfig) -> Iterator[RunningDaemon]:
    with running_daemon(config) as daemon:
        yield daemon


def test_a_message_is_answered_as_its_unary_call(served: RunningDaemon) -> None:
    """The answer and the refusal of a framed message are the unary call's,
    details included; the socket is the daemon's user's alone."""
    assert path_of(served).stat().st_mode & 0o777 == 0o600
    with connected(served) as conn, grpc.insecure_channel(served.target) as channel:
        stub = pb_grpc.ToolLedgerStub(channel)
        got = conn.ask(message(1, prepare("a")), message(2, prepare("a", start=False)))
        assert got[1].prepare_tool.decision == pb.DECISION_EXECUTE
        unary = stub.PrepareTool(prepare("a"))
        assert got[2].prepare_tool.decision == unary.decision  # IN_PROGRESS, both
        missing = pb.GetToolCallRequest(ref=pb.CallRef(run_id="run", call_id="none"))
        framed_refusal = decode_status(conn.ask(message(3, missing))[3].error)
        with pytest.raises(grpc.RpcError) as unary_error:
            stub.GetToolCall(missing)
        assert framed_refusal == decode(unary_error.value)


def test_a_bad_message_is_refused_invalid_argument_with_its_field(
    served: RunningDaemon,
) -> None:
    with connected(served) as conn:
        bad = pb.PrepareToolRequest(ref=pb.CallRef(run_id="r:x", call_id="c"))
        refusal = decode_status(conn.ask(message(1, bad))[1].error)
        assert refusal.code is R.INVALID_ARGUMENT
        assert refusal.fields is not None
        assert "ref.run_id" in refusal.fields


def test_the_hello_is_authenticated_and_each_message_authorized(
    short_tmp: Path,
) -> None:
    """A wrong token, or none, is refused UNAUTHENTICATED at the hello (the
    negative control of a transport that would skip the gate); a token is
    welcomed, its messages authorized for their own RPC (an approver may not
    prepare) and kept in its namespace, as on the gRPC stream."""
    with authenticated_daemon(short_tmp / "data") as (daemon, _):
        for token in ("not-a-token", ""):
            conn = Framed(path_of(daemon))
            conn.send(framed.HELLO + token.encode())
            refusal = conn.ended()
            assert (refusal.code, refusal.reason) == (
                R.UNAUTHENTICATED,
                "UNAUTHENTICATED",
            )
            conn.close()
        with connected(daemon, APPROVER_A) as conn:
            refusal = decode_status(conn.ask(message(1, prepare("a")))[1].error)
            assert (refusal.code, refusal.reason) == (
                R.PERMISSION_DENIED,
                "PERMISSION_DENIED",
            )
        with connected(daemon, AGENT_A) as conn:
            ok = conn.ask(message(1, prepare("a")))[1]
            assert ok.prepare_tool.call.ref.namespace == "a"
            other = pb.PrepareToolRequest(
                ref=pb.CallRef(namespace="b", run_id="r", call_id="c"),
                tool_name="t",
                input=pb.Payload(json="{}"),
            )
            refusal = decode_status(conn.ask(message(2, other))[2].error)
            assert refusal.code is R.NOT_FOUND


class _PeerSocket:
    """Stands in for a connected socket whose peer runs as `uid`."""

    def __init__(self, uid: int) -> None:
        self.uid = uid

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option) == (socket.SOL_SOCKET, socket.SO_PEERCRED)
        return struct.pack("3i", 1234, self.uid, self.uid)


@pytest.mark.parametrize(
    ("uid", "allowed"),
    [(os.geteuid(), True), (0, True), (os.geteuid() + 4242, False)],
)
def test_the_peer_must_be_the_daemons_user_or_root(uid: int, allowed: bool) -> None:
    assert framed._peer_allowed(_PeerSocket(uid)) is allowed  # type: ignore[arg-type]
    assert framed._peer_allowed(None) is False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_user_is_refused_permission_denied(served: RunningDaemon) -> None:
    """With the socket's mode and its directories opened up, a process of
    another user reaches it and is refused by its peer credentials before
    its hello (the child reports what it read through a pipe)."""
    path = path_of(served)
    path.chmod(0o666)
    for directory in (path.parent, path.parent.parent):
        directory.chmod(0o755)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child only reports)
        sent = b""
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(str(path))
            while chunk := sock.recv(65536):
                sent += chunk
        finally:
            os.write(write, sent)
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    sent = os.read(read, 65536)
    os.close(read)
    (size,) = HEADER.unpack_from(sent)
    end = pb.SessionResponse.FromString(sent[HEADER.size : HEADER.size + size])
    assert decode_status(end.error).code is R.PERMISSION_DENIED
    still_serves(served)


def test_a_frame_over_the_message_limit_is_refused(short_tmp: Path) -> None:
    """As gRPC refuses a message over `--max-message-size`: RESOURCE_EXHAUSTED,
    and the connection ends; the daemon serves on."""
    limits = ServerLimits(max_message_bytes=1 << 10)
    with running_daemon(
        ServeConfig(data_dir=short_tmp / "data", server_limits=limits)
    ) as daemon:
        with connected(daemon) as conn:
            conn.raw(HEADER.pack((1 << 10) + 1))
            refusal = conn.ended()
            assert refusal.code is R.RESOURCE_EXHAUSTED
        conn = Framed(path_of(daemon))
        conn.raw(HEADER.pack(1 << 31))  # before the hello too
        assert conn.ended().code is R.RESOURCE_EXHAUSTED
        conn.close()
        still_serves(daemon)


def test_a_hello_that_is_none_ends_the_connection(served: RunningDaemon) -> None:
    conn = Framed(path_of(served))
    conn.send(b"GET / HTTP/1.1\r\n")
    refusal = conn.ended()
    assert (refusal.code, refusal.fields) == (R.INVALID_ARGUMENT, ("hello",))
    conn.close()
    still_serves(served)


def test_a_message_that_does_not_parse_ends_the_stream_after_the_others(
    served: RunningDaemon,
) -> None:
    """As on the gRPC stream: the messages before it are answered, then the
    stream ends INVALID_ARGUMENT."""
    with connected(served) as conn:
        conn.send(message(1, prepare("a")).SerializeToString())
        conn.send(b"\xff\xff\xff")
        first = conn.read()
        assert first.id == 1
        assert first.prepare_tool.decision == pb.DECISION_EXECUTE
        assert conn.ended().code is R.INVALID_ARGUMENT
    still_serves(served)


def test_a_half_closed_connection_is_answered_then_ended(served: RunningDaemon) -> None:
    with connected(served) as conn:
        conn.send(message(1, prepare("a")).SerializeToString())
        conn.sock.shutdown(socket.SHUT_WR)
        assert conn.read().id == 1
        with pytest.raises(EOFError):
            conn.read()


def test_random_frames_never_crash_the_daemon(served: RunningDaemon) -> None:
    """A fuzz of the wire: random bytes, random frames and random messages,
    with and without a hello. Whatever comes back is a frame the client can
    read, never INTERNAL; the daemon answers a good connection after each."""
    seed = random.randrange(1 << 32)  # noqa: S311 - a test seed
    print(f"seed {seed}")
    rng = random.Random(seed)  # noqa: S311 - the fuzz's bytes
    for case in range(60):
        conn = Framed(path_of(served), timeout=5.0)
        try:
            fuzz(conn, rng, case)
            conn.sock.shutdown(socket.SHUT_WR)
            while True:
                answer = conn.read()
                if answer.WhichOneof("response") == "error":
                    assert decode_status(answer.error).code is not R.INTERNAL, seed
        except (EOFError, ConnectionError):
            pass  # the daemon closed it: refused, or done (never left hanging)
        finally:
            conn.close()
        if case % 10 == 0:
            still_serves(served)
    still_serves(served)


def fuzz(conn: Framed, rng: random.Random, case: int) -> None:
    """Sends what a confused or hostile client might: a hello or not, then
    raw bytes, frames of random bytes, and messages with bytes flipped."""
    if rng.random() < 0.7:
        conn.hello()
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.3:
            conn.raw(rng.randbytes(rng.randint(1, 64)))
        elif kind < 0.6:
            conn.send(rng.randbytes(rng.randint(0, 200)))
        else:
            msg = message(
                rng.randint(0, 3), prepare(f"f{case}", start=rng.random() < 0.5)
            )
            data = bytearray(msg.SerializeToString())
            for _ in range(rng.randint(0, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            conn.send(bytes(data))


def test_the_framed_socket_goes_with_the_daemon(config: ServeConfig) -> None:
    with running_daemon(config) as daemon:
        path = path_of(daemon)
        assert path.exists()
    assert not path.exists()
