"""The local framed transport: the session stream's messages over a plain
Unix socket beside the gRPC one, for a client on the same host
(docs/contract.md §2.8; on unless `--no-local-frames`).

A frame is a 4-byte big-endian length, then that many bytes of protobuf.
The client's first frame is a `SessionHello`: what the stream's metadata
carries on gRPC (the `authorization` and `traceparent` values, and the
version of these frames). Every later frame of the client is a
`SessionRequest`, every frame of the daemon a `SessionResponse`; a response
of id 0 ends the session with its `error` (a refused hello, a frame that is
not a request, the daemon stopping), and the daemon then closes the
connection. Message ids start at 1. A client that is done shuts down its
side of the socket (as a gRPC client half-closes its stream): the messages
in flight are answered, then the daemon closes.

Only transport lives here: the hello becomes the stream's metadata, the
gate authenticates and authorizes it as the `Session` call it stands for,
the boundary admits and records it, and `sidecar.rpc.session` serves its
messages, each as its unary RPC; `_Context` is what they use of a gRPC
servicer context. A peer of another user is closed on, unanswered (the
socket is 0600, as the gRPC one).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from google.protobuf.message import DecodeError

from sidecar.rpc.boundary import Unparsed
from sidecar.rpc.errors import Status, details_of, plain_status
from sidecar.rpc.session import SESSION

log = logging.getLogger(__name__)

VERSION = 1
_HEADER = struct.Struct(">I")
_PEER = struct.Struct("3i")  # struct ucred: pid, uid, gid
# How long a connection may take to send its hello.
HELLO_SECONDS = 10.0


def frames_path(grpc_socket: Path) -> Path:
    """The framed transport's socket beside the gRPC one (effectd.sock:
    effectd.frames.sock)."""
    return grpc_socket.with_name(f"{grpc_socket.stem}.frames{grpc_socket.suffix}")


class _TooBig(Exception):
    pass


async def _frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    """The next frame's bytes; None at the end of the client's side."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if size > max_bytes:
            raise _TooBig(f"a frame of {size} bytes is over the limit of {max_bytes}")
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def _ending(status: grpc.Status) -> pb.SessionResponse:
    return pb.SessionResponse(id=0, error=details_of(status))


class _Details(grpc.HandlerCallDetails):
    """The `Session` call a hello stands for, as the gate sees a call."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = SESSION
        self.invocation_metadata = metadata


class _Context:
    """What the boundary and the session stream use of a gRPC servicer
    context: writing an answer, ending the session with a status, and what
    it ended with."""

    def __init__(self, writer: asyncio.StreamWriter, peer: str) -> None:
        self._writer = writer
        self._peer = peer
        self._code: grpc.StatusCode | None = None
        # The client's side failed: nothing more is written.
        self.gone = False

    def peer(self) -> str:
        return self._peer

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def time_remaining(self) -> float | None:
        return None  # a session lives as long as its client lets it

    async def write(self, message: Any) -> None:
        if self.gone:
            return
        data = message.SerializeToString()
        self._writer.write(_HEADER.pack(len(data)) + data)
        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            self.gone = True

    async def abort(
        self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()
    ) -> None:
        self._code = code
        await self.write(_ending(Status(code, details, tuple(trailing_metadata or ()))))
        raise grpc.aio.AbortError()


def _peer_of(sock: socket.socket | None) -> tuple[int, int] | None:
    """The connecting process's pid and uid (SO_PEERCRED), None when the
    socket cannot tell."""
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size)
    except OSError:
        return None
    pid, uid, _ = _PEER.unpack(raw)
    return pid, uid


def _allowed(uid: int) -> bool:
    """Whether a peer of user `uid` is served: this daemon's, or root."""
    return uid in (os.geteuid(), 0)


Lookup = Callable[[grpc.HandlerCallDetails], Any]


def lookup_in(handlers: tuple[grpc.GenericRpcHandler[Any, Any], ...]) -> Lookup:
    """The method handler of a call among the daemon's servicers."""

    def lookup(details: grpc.HandlerCallDetails) -> Any:
        for generic in handlers:
            found = generic.service(details)
            if found is not None:
                return found
        raise LookupError(details.method)

    return lookup


class FramesServer:
    """Serves the framed transport on `path` through `gate` (its
    `intercept_service`, as for a gRPC call), the session's handler found
    by `lookup`; frames of at most `max_bytes`."""

    def __init__(self, path: Path, gate: Any, lookup: Lookup, max_bytes: int) -> None:
        self.path = path
        self._gate = gate
        self._lookup = lookup
        self._max_bytes = max_bytes
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        # The caller holds the gRPC socket's lock: a file here is a crash's.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(
            self._connected, path=str(self.path)
        )
        os.chmod(self.path, 0o600)

    async def stop(self, grace: float) -> None:
        """Takes no new connection; the sessions answer what they have in
        flight (the daemon is draining) within `grace` seconds, then end."""
        if self._server is None:
            return
        self._server.close()
        self._server = None
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=grace)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except grpc.aio.AbortError:
            pass  # ended with its status, written
        except Exception:
            log.exception("internal error on the framed transport")
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = _peer_of(writer.get_extra_info("socket"))
        if peer is None or not _allowed(peer[1]):
            log.warning("framed transport: closed a peer of another user (%s)", peer)
            return
        context = _Context(writer, f"unix:pid {peer[0]}")
        try:
            raw = await asyncio.wait_for(_frame(reader, self._max_bytes), HELLO_SECONDS)
            hello = None if raw is None else pb.SessionHello.FromString(raw)
        except (TimeoutError, _TooBig, DecodeError) as exc:
            await _refuse(context, f"no valid SessionHello first: {exc}")
            return
        if hello is None:
            return
        if hello.version != VERSION:
            await _refuse(
                context, f"SessionHello.version {hello.version} is not {VERSION}"
            )
            return
        metadata = tuple(
            (key, value)
            for key, value in (
                ("authorization", hello.authorization),
                ("traceparent", hello.traceparent),
            )
            if value
        )
        handler = await self._gate.intercept_service(
            _found(self._lookup), _Details(metadata)
        )
        requests = _requests(reader, handler.request_deserializer, self._max_bytes)
        served = handler.stream_stream(requests, context)
        if inspect.isasyncgen(served):  # the gate's refusal: it aborts
            async for _ in served:
                pass
        else:
            await served
        if not context.gone:
            # The client's side ended and every message was answered.
            writer.write_eof()


async def serve_frames(
    grpc_socket: Path,
    gate: Any,
    servicers: tuple[grpc.GenericRpcHandler[Any, Any], ...],
    max_bytes: int,
    *,
    serve: bool,
) -> FramesServer | None:
    """The framed transport, started beside `grpc_socket`; None when not
    `serve` (a socket left there by a daemon that crashed is removed, so
    that clients find none and use gRPC), or, with a warning, when its
    socket cannot be made (a path past the 107 bytes a Unix socket's name
    may have)."""
    path = frames_path(grpc_socket)
    if not serve:
        # The caller holds the gRPC socket's lock: a file here is a crash's.
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()
        return None
    server = FramesServer(path, gate, lookup_in(servicers), max_bytes)
    try:
        await server.start()
    except OSError as exc:
        log.warning(
            "the framed transport is not served (%s: %s); clients use gRPC",
            path,
            exc,
        )
        return None
    return server


def _found(lookup: Lookup) -> Callable[[grpc.HandlerCallDetails], Any]:
    async def continuation(details: grpc.HandlerCallDetails) -> Any:
        return lookup(details)

    return continuation


async def _refuse(context: _Context, message: str) -> None:
    status = plain_status(grpc.StatusCode.INVALID_ARGUMENT, message)
    await context.write(_ending(status))


async def _requests(
    reader: asyncio.StreamReader,
    deserialize: Callable[[bytes], Any] | None,
    max_bytes: int,
) -> AsyncIterator[Any]:
    """The client's SessionRequests as the gate's deserializer makes them
    (`Unparsed` for one that does not parse), until its side ends."""
    while True:
        try:
            data = await _frame(reader, max_bytes)
        except _TooBig as exc:
            yield Unparsed("SessionRequest", str(exc))
            return
        if data is None:
            return
        request = data if deserialize is None else deserialize(data)
        if isinstance(request, pb.SessionRequest) and request.id == 0:
            yield Unparsed("SessionRequest", "id 0 is reserved on the framed transport")
            return
        yield request
