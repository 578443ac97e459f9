"""The framed local transport: the session stream's messages over a plain
Unix socket, for clients on the daemon's host.

gRPC stays the public contract and the way every language reaches effectd;
this is a second way in for a co-located client, next to the gRPC socket
(its path with `FRAMED_SUFFIX`), served into the same request boundary.

Wire: every frame is a 4-byte big-endian length, then that many bytes. The
client's first frame is its hello, `HELLO` followed by its bearer token
(UTF-8, empty for none); every later frame is one `SessionRequest`. The
daemon's frames are `SessionResponse`s: the first, id 0, answers the hello
(no `response`: welcome; `error`: refused, and the connection is closed);
then each message's answer, as on the stream; a frame of id 0 with an
`error` ends the connection as a status ends a stream.

The same rules as a gRPC session stream, in the same code: the hello is
admitted by the gate (`Gate.admitted`: the token authenticated, `Session`
authorized for its roles), the connection is served as a session stream
(`Gate.session`, `Boundary.session`: a slot of the session pool, each
message authorized for its own RPC, admitted, given its deadline, answered
or refused and recorded as the unary call; `sidecar.rpc.session`). Besides:
the peer's credentials (`SO_PEERCRED`) must be this daemon's user or root
(the socket is 0600 too); a frame longer than the daemon's message limit is
refused RESOURCE_EXHAUSTED, as gRPC refuses such a message, and ends the
connection; a hello that does not come within the handshake timeout, or
that is not one, ends it too; a frame that does not parse ends the stream
INVALID_ARGUMENT, as on gRPC.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from google.protobuf.message import DecodeError

from sidecar.errors import EffectdError, FieldViolation, InvalidArgument
from sidecar.rpc.boundary import Unparsed
from sidecar.rpc.errors import details_of, plain_status, status_of, to_status
from sidecar.rpc.gate import Gate
from sidecar.rpc.session import SESSION

log = logging.getLogger(__name__)

FRAMED_SUFFIX = ".framed"
HELLO = b"effectd-framed/1\n"
HEADER = struct.Struct(">I")
_PEERCRED = struct.Struct("3i")
# sockaddr_un's sun_path, with its terminating NUL.
_MAX_PATH = 108
# Frames read but not yet taken by the stream past which reading pauses (the
# stream itself takes at most its in-flight limit): the client is held back
# by the socket's buffers, as gRPC's flow control holds it.
_BACKLOG = 64


def _parse(payload: bytes) -> pb.SessionRequest | Unparsed:
    """One message, or `Unparsed`: the stream then ends INVALID_ARGUMENT
    once the messages before it are answered, as on gRPC."""
    try:
        return pb.SessionRequest.FromString(payload)
    except DecodeError as exc:
        return Unparsed("effectd.v1.SessionRequest", str(exc))


def framed_path(grpc_socket: Path) -> Path:
    """Where the framed transport listens beside the gRPC socket."""
    return grpc_socket.with_name(grpc_socket.name + FRAMED_SUFFIX)


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


class FramedServer:
    """Serves the framed transport on one Unix socket, into `gate`."""

    def __init__(
        self,
        gate: Gate,
        session: Callable[..., Any],
        *,
        max_frame_bytes: int,
        handshake_seconds: float,
    ) -> None:
        self._gate = gate
        self._session = session
        self.max_frame_bytes = max_frame_bytes
        self.handshake_seconds = handshake_seconds
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[Connection] = set()

    async def start(self, path: Path) -> None:
        """Listens on `path`; the caller holds the socket lock, so a file
        there is left from a crash (removed)."""
        if len(os.fsencode(path)) >= _MAX_PATH:
            log.warning("the framed transport is off: %s is too long a path", path)
            return
        await asyncio.to_thread(_remove, path)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: Connection(self), path=str(path)
        )
        os.chmod(path, 0o600)

    async def stop(self, grace: float) -> None:
        """Stops accepting; the connections end as their streams drain
        (`Draining`), and those left after `grace` seconds are cut."""
        if self._server is None:
            return
        self._server.close()
        self._server = None
        waits = [c.ended for c in self._connections]
        if waits:
            await asyncio.wait(waits, timeout=grace)
        for connection in list(self._connections):
            connection.cut()

    def admit(self, token: str) -> Any:
        """The session handler for a hello bringing `token`, or the
        `EffectdError` it is refused with (recorded by the gate)."""
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        call = self._gate.admitted(SESSION, metadata)
        if isinstance(call, EffectdError):
            return call
        return self._gate.session(call, self._session)

    def opened(self, connection: Connection) -> None:
        self._connections.add(connection)

    def closed(self, connection: Connection) -> None:
        self._connections.discard(connection)


class _Requests:
    """The connection's messages as the async iterator a stream reads."""

    def __init__(self, resume: Callable[[], None]) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self.ended = False
        self._ready = asyncio.Event()
        self._resume = resume

    def put(self, item: Any) -> None:
        self.items.append(item)
        self._ready.set()

    def end(self) -> None:
        self.ended = True
        self._ready.set()

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        while not self.items:
            if self.ended:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        item = self.items.popleft()
        if len(self.items) < _BACKLOG // 2:
            self._resume()
        return item


class Connection(asyncio.Protocol):
    """One client's connection: its hello, then a session stream."""

    def __init__(self, server: FramedServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._requests = _Requests(self._resume)
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self._writable: asyncio.Future[None] | None = None
        self._code: grpc.StatusCode | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server.opened(self)
        if not _peer_allowed(transport.get_extra_info("socket")):
            self._refuse(
                plain_status(
                    grpc.StatusCode.PERMISSION_DENIED,
                    "the framed transport serves this daemon's user only",
                )
            )
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._server.handshake_seconds, self._late)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        limit = self._server.max_frame_bytes
        while len(buffer) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, start)
            if size > limit:
                self._refuse(
                    plain_status(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"a frame of {size} bytes is over the limit of {limit}",
                    )
                )
                return
            end = start + HEADER.size + size
            if len(buffer) < end:
                break
            payload = bytes(buffer[start + HEADER.size : end])
            start = end
            if not self._took(payload):
                return
        del buffer[:start]
        if len(self._requests.items) >= _BACKLOG and not self._paused:
            assert self._transport is not None
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        # The client half-closed: the messages in flight are still answered;
        # before a hello there is nothing to answer.
        self._requests.end()
        if self._task is None:
            self.cut()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._requests.end()
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()  # as gRPC cancels a stream whose client went
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._server.closed(self)
        if not self.ended.done():
            self.ended.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- frames ----------------------------------------------------------

    def _took(self, payload: bytes) -> bool:
        """Handles one frame; whether the connection still reads."""
        if self._task is None:
            return self._hello(payload)
        self._requests.put(_parse(payload))
        return True

    def _hello(self, payload: bytes) -> bool:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not payload.startswith(HELLO):
            bad = InvalidArgument(
                [FieldViolation("hello", "is not an effectd-framed/1 hello")]
            )
            self._refuse(to_status(bad))
            return False
        # Bytes that are no UTF-8 make a token no credential matches.
        token = payload[len(HELLO) :].decode(errors="replace")
        handler = self._server.admit(token)
        if isinstance(handler, EffectdError):
            self._refuse(to_status(handler))
            return False
        self._send(pb.SessionResponse(id=0))
        self._task = asyncio.create_task(self._serve(handler))
        return True

    async def _serve(self, handler: Callable[..., Any]) -> None:
        try:
            await handler(self._requests, self)
        except grpc.aio.AbortError:
            pass  # the end frame is sent
        except asyncio.CancelledError:
            pass  # the client went
        except Exception:
            log.exception("the framed connection failed")
        self.cut()

    def _send(self, response: pb.SessionResponse) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(frame(response.SerializeToString()))

    def _refuse(self, status: grpc.Status) -> None:
        """Ends the connection with `status` (the hello's answer, or the
        end of its stream)."""
        self._code = status.code
        self._send(pb.SessionResponse(id=0, error=details_of(status)))
        self.cut()

    def _late(self) -> None:
        self._timer = None
        self._refuse(
            plain_status(grpc.StatusCode.UNAVAILABLE, "no hello within the timeout")
        )

    def _resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def cut(self) -> None:
        """Closes the connection once what it wrote is sent."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    # -- what the session stream's handler asks of its context ---------------

    async def write(self, response: pb.SessionResponse) -> None:
        self._send(response)
        if self._writable is not None:
            await self._writable

    async def abort(
        self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()
    ) -> None:
        self._refuse(status_of(code, details, trailing_metadata or ()))
        raise grpc.aio.AbortError(details)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def time_remaining(self) -> float | None:
        return None


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _peer_allowed(sock: socket.socket | None) -> bool:
    """Whether the peer runs as this daemon's user, or as root."""
    if sock is None:
        return False
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return False
    _, uid, _ = _PEERCRED.unpack(raw)
    return uid in {0, os.geteuid()}
