"""The asyncio client's ledger session over the daemon's framed transport
(docs/contract.md §2.8): the session's messages as length-prefixed frames on
`effectd.frames.sock`, an asyncio protocol on the event loop.

A caller writes its frame whole into the connection's transport, in one
step of the event loop (so frames never interleave, and a caller cancelled
afterwards cannot cut one short), and awaits a future; the connection's
protocol parses the daemon's frames as they arrive and completes the future
whose id each answer carries, every whole frame before it handles the
connection's end (so an answer that came before a reset, or before a write
that failed, is never lost). The caller's wait, deadline and cancellation
are `effectd_client._session_aio`'s `SessionCalls`; the frames, the hello
and which daemon is asked so are `effectd_client._frames_wire`'s, as for
the sync client; the messages, the table of those in flight and the end
of a connection are `effectd_client._session_wire`'s.

A message the transport took may have reached the daemon: if its connection
breaks, it fails `mayHaveBeenApplied=true`. A connection found closing (its
end not handled yet) is not written to: the message goes on a new one; one
that finds no connection is not sent (`mayHaveBeenApplied=false`: the client
waits for the daemon). A daemon found serving gRPC without the framed socket
is asked by the unary RPCs for `NO_FRAMES_PAUSE` seconds, then the framed
socket is tried again.
"""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import suppress
from typing import Any

import grpc.aio
from effectd.v1 import ledger_pb2 as pb

from effectd_client import _frames_wire
from effectd_client import _session_wire as wire
from effectd_client._channel import Connection, Metadata
from effectd_client._frames_wire import HEADER, frame, frames_of, hello, local_socket
from effectd_client._session_aio import (
    AsyncSession,
    SessionCalls,
    Waiter,
    fail,
    settle,
)

# How long the gRPC socket may take to accept the probe of `_grpc_alone`.
_PROBE_SECONDS = 1.0
# What a connection's end reads of the socket at a time.
_DRAIN_BYTES = 1 << 16


def session_of(
    connection: Connection, channel: grpc.aio.Channel
) -> AsyncSession | AsyncFramesSession:
    """The asyncio client's ledger session: on the framed transport when
    the daemon serves it on this host (`_frames_wire.local_socket`), else the
    gRPC session stream of `channel`."""
    grpc_socket = local_socket(connection.target)
    if grpc_socket is None:
        return AsyncSession(channel, connection.metadata)
    return AsyncFramesSession(
        grpc_socket, connection.metadata, connection.max_message_bytes
    )


async def _grpc_alone(grpc_socket: str) -> bool:
    """`_frames_wire.grpc_alone` without blocking the event loop: whether the
    daemon's gRPC socket takes a connection."""
    try:
        async with asyncio.timeout(_PROBE_SECONDS):
            _, writer = await asyncio.open_unix_connection(grpc_socket)
    except OSError:
        return False
    writer.close()
    with suppress(OSError):
        await writer.wait_closed()
    return True


class _Conn(asyncio.Protocol):
    """One connection: its transport, the bytes of a frame not whole yet,
    and whether its end was handled. Each whole frame goes to the session
    as it arrives."""

    def __init__(self, session: AsyncFramesSession) -> None:
        self._session = session
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.dead = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        buffer, at = self._buffer, 0
        try:
            while not self.dead and len(buffer) - at >= HEADER.size:
                (size,) = HEADER.unpack_from(buffer, at)
                if size > self._session._max_bytes:
                    limit = self._session._max_bytes
                    raise ValueError(
                        f"a frame of {size} bytes is over the limit of {limit}"
                    )
                end = at + HEADER.size + size
                if len(buffer) < end:
                    break
                answer = pb.SessionResponse.FromString(
                    bytes(buffer[at + HEADER.size : end])
                )
                at = end
                self._session._answered(self, answer)
        except Exception as exc:  # a frame over the limit, or that does not parse
            self._session._ended(self, exc)
        del buffer[:at]

    def eof_received(self) -> bool:
        return False  # the daemon is done: close, and end the connection

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.dead:
            self._drain()
        if not self.dead:
            self._session._ended(self, exc)

    def _drain(self) -> None:
        """What the daemon sent before the end and the transport had not
        read, read now: a transport whose write failed (the daemon closed)
        ends without reading on, which would lose answers, or the status
        the daemon ended the session with. The socket is open until this
        protocol has heard of the end."""
        transport = self.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        fd = -1 if sock is None else sock.fileno()
        while fd >= 0 and not self.dead:
            try:
                data = os.read(fd, _DRAIN_BYTES)
            except OSError:  # nothing more, or the connection's error
                return
            if not data:
                return
            self.data_received(data)

    def open(self) -> bool:
        transport = self.transport
        return not self.dead and transport is not None and not transport.is_closing()

    def write(self, data: bytes) -> bool:
        """Whether the connection took the frame `data` (then it may reach
        the daemon); False when it is closing, and sent nothing of it."""
        if not self.open():
            return False
        assert self.transport is not None
        self.transport.write(data)
        return True

    def end(self) -> None:
        # At once, what is still buffered too: a daemon that went away, or
        # a client that closes, waits for no flush.
        self.dead = True
        if self.transport is not None:
            self.transport.abort()


class AsyncFramesSession(SessionCalls):
    """The ledger session of one `AsyncClient` on the framed transport (see
    the module docstring); its interface is `AsyncSession`'s."""

    def __init__(self, grpc_socket: str, metadata: Metadata, max_bytes: int) -> None:
        super().__init__()
        self._grpc_socket = grpc_socket
        self._path = frames_of(grpc_socket)
        self._hello = hello(metadata)
        self._max_bytes = max_bytes
        # The open connection, None once it ended (named as AsyncSession's
        # stream: whoever asks whether the session saw its daemon go reads
        # either the same way).
        self._stream: _Conn | None = None
        # One caller at a time opens a connection; the others wait for it.
        self._opening = asyncio.Lock()

    async def _send(self, entry: wire.Entry[Waiter]) -> None:
        """Writes the message on the open connection, or a new one."""
        try:
            data = frame(entry.message, self._max_bytes)
        except wire.SessionRpcError as exc:  # over the limit: not sent
            self._table.drop(entry)
            fail(entry.waiter, exc)
            return
        while True:
            try:
                conn = await self._connection()
            except OSError as exc:
                await self._no_connection(entry, exc)
                return
            if conn is None or not self._table.pending(entry):
                return  # closed, or its caller stopped waiting
            # Open, as `_connection` saw it: nothing ran since.
            if conn.write(data):
                entry.stream, entry.sent = conn, True
                return

    async def _connection(self) -> _Conn | None:
        """The open connection, opened if need be; None once closed."""
        conn = self._stream
        if conn is not None and conn.open():
            return conn
        async with self._opening:
            if self._closed:
                return None
            conn = self._stream
            if conn is not None and conn.open():
                return conn  # another caller's
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_unix_connection(lambda: _Conn(self), self._path)
            if self.closed:  # while it connected
                conn.end()
                return None
            conn.write(frame(self._hello))
            self._stream = conn
            return conn

    async def _no_connection(self, entry: wire.Entry[Waiter], error: OSError) -> None:
        """The message of `entry` found no connection: asked by its unary
        RPC when the daemon serves gRPC alone, else failed as not sent."""
        alone = await _grpc_alone(self._grpc_socket)
        if not self._table.drop(entry):
            return  # closed meanwhile: its future failed
        if alone:
            # Its unary RPCs, for a while: the message was not sent.
            self._unary_until = time.monotonic() + _frames_wire.NO_FRAMES_PAUSE
            settle(entry.waiter, wire.UNARY)
        else:
            fail(entry.waiter, _frames_wire.not_connected(error))

    def _stop_waiting(self, entry: wire.Entry[Waiter]) -> bool:
        if not self._table.drop(entry):
            return False
        conn = entry.stream
        if entry.sent and isinstance(conn, _Conn):
            conn.write(frame(wire.cancel(entry.message.id)))  # unless closing
        return True

    def _answered(self, conn: _Conn, answer: Any) -> None:
        if answer.id == 0:  # the daemon ended the session
            self._ended(conn, wire.SessionRpcError(answer.error))
            return
        entry = self._table.answer(answer.id)
        if entry is not None:
            settle(entry.waiter, answer)

    def _ended(self, conn: _Conn, error: BaseException | None) -> None:
        conn.end()
        if self._stream is conn:
            self._stream = None
        for entry in self._settle_end(conn, error):
            # A message `conn` had not taken, by `wire.ended`: sent again on
            # a new connection (none here: a message is on a connection
            # once written to it).
            self._keep(self._send(entry))

    async def close(self) -> None:
        """Ends the connection: the messages in flight fail as a broken
        connection's (outcome unknown), those it had not taken CANCELLED."""
        if self._closed:
            return
        self._closed = True
        conn, self._stream = self._stream, None
        for entry in self._table.clear():
            fail(entry.waiter, _frames_wire.at_close(entry.sent))
        if conn is not None:
            conn.end()
        await self._await_tasks()
