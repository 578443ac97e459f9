"""The sync client's ledger session over the daemon's framed transport
(docs/contract.md §2.8): the session's messages as length-prefixed frames on
`effectd.frames.sock`, a blocking socket, no helper thread.

A caller sends its message under the session's lock and waits for its
answer; one waiting caller at a time reads the socket (outside the lock),
hands each answer to the caller whose id it carries and goes on until its
own has come, then lets another waiting caller read. The messages, the table
of those in flight, the errors and what the end of a connection means are
`effectd_client._session_wire`'s, as on the gRPC stream: a message the
connection took is failed `mayHaveBeenApplied=true` if it breaks, one it had
not taken is sent once more on a new connection, and a daemon that refuses
the session as a whole (`_session_wire.ended`) is asked by the unary RPCs.
A write that fails ends no connection by itself: what the daemon sent
before it closed (answers, or the status it ended the session with) is read
first, by a waiting caller, up to the connection's end.

A client uses it for a `unix:` target whose daemon serves the framed socket
(`--local-frames`), unless `EFFECTD_TRANSPORT=grpc`; `local_socket` says. A
daemon found serving gRPC without it (restarted with `--no-local-frames`, or
one older than it) is asked by the unary RPCs, and the framed socket tried
again `NO_FRAMES_PAUSE` seconds later.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from effectd.v1 import ledger_pb2 as pb
from google.protobuf.message import DecodeError

from effectd_client import _session_wire as wire
from effectd_client._channel import Metadata
from effectd_client._frames_wire import (
    HEADER,
    NO_FRAMES_PAUSE,
    at_close,
    frame,
    frames_of,
    hello,
    not_connected,
)
from effectd_client._frames_wire import grpc_alone as _grpc_alone
from effectd_client._session import stub_method


class _Answer:
    """One caller's answer, set under the session's lock."""

    __slots__ = ("answer", "done", "error")

    def __init__(self) -> None:
        self.done = False
        self.answer: Any = None
        self.error: Exception | None = None

    def set(self, answer: Any) -> None:
        self.answer, self.done = answer, True

    def fail(self, error: Exception) -> None:
        self.error, self.done = error, True


class _Conn:
    """One connection: its socket and whether it has ended."""

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.sock = sock
        # The largest frame read: a larger one ends the connection.
        self.max_bytes = max_bytes
        self.dead = False
        # A write failed: the daemon closed (or the connection broke). What
        # it sent before is still to be read; nothing more is written.
        self.unwritable = False
        # The wait for an answer's first byte. The socket itself stays
        # blocking: a timeout set on it would cut the sends of other
        # threads short too.
        self._readable = select.poll()
        self._readable.register(sock, select.POLLIN)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout: float | None) -> Any:
        """The next frame's SessionResponse; raises TimeoutError when none
        began within `timeout` (nothing of it read), EOFError at the
        daemon's end."""
        if timeout is not None and not self._readable.poll(math.ceil(timeout * 1000)):
            raise TimeoutError
        (size,) = HEADER.unpack(self._exactly(HEADER.size))
        if size > self.max_bytes:
            raise ValueError(
                f"a frame of {size} bytes is over the limit of {self.max_bytes}"
            )
        try:
            return pb.SessionResponse.FromString(self._exactly(size))
        except DecodeError as exc:
            raise ValueError(
                f"a frame of the daemon is not a SessionResponse: {exc}"
            ) from None

    def _exactly(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise EOFError("the daemon closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


class FramesSession:
    """The ledger session of one sync `Client` on the framed transport (see
    the module docstring); its interface is `effectd_client._session`'s."""

    def __init__(self, grpc_socket: str, metadata: Metadata, max_bytes: int) -> None:
        self._grpc_socket = grpc_socket
        self._path = frames_of(grpc_socket)
        self._hello = hello(metadata)
        self._max_bytes = max_bytes
        self._unary = False
        self._unary_until = 0.0
        self._closed = False
        self._reset()
        _SESSIONS.add(self)

    def _reset(self) -> None:
        self._lock = threading.Condition()
        self._table: wire.InFlight[_Answer] = wire.InFlight()
        self._conn: _Conn | None = None
        # Connections whose write failed, read to their end (`_unwritable`).
        self._draining: set[_Conn] = set()
        self._reading = False

    @property
    def unary(self) -> bool:
        return self._unary

    def method(self, name: str, unary: Callable[..., Any]) -> Callable[..., Any]:
        """RPC `name` called as a stub's method, through this session."""
        return stub_method(self.call, name, unary)

    def call(self, name: str, body: Any, timeout: float | None) -> Any:
        """The answer of RPC `name`, `_session_wire.UNARY` when the session is not
        served; raises `SessionRpcError`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = _Answer()
        with self._lock:
            if self._closed:
                raise wire.closed()
            if self._unary or time.monotonic() < self._unary_until:
                return wire.UNARY
            entry = self._table.add(name, body, timeout, waiter)
            self._send(entry)
        self._wait(entry, deadline)
        if waiter.error is not None:
            raise waiter.error
        if waiter.answer is wire.UNARY:
            return wire.UNARY
        return wire.outcome(name, waiter.answer)

    def _wait(self, entry: wire.Entry[_Answer], deadline: float | None) -> None:
        """Until `entry` is answered, reading the socket when no other
        caller does; past `deadline`, its message is cancelled and it fails
        DEADLINE_EXCEEDED."""
        waiter = entry.waiter
        while True:
            with self._lock:
                while not waiter.done:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        self._late(entry)
                        return
                    conn = entry.stream
                    if not self._reading and isinstance(conn, _Conn) and not conn.dead:
                        self._reading = True
                        break
                    self._lock.wait(left)
                else:
                    return
            self._read(conn, waiter, deadline)

    def _late(self, entry: wire.Entry[_Answer]) -> None:
        # Holds the lock. Its caller stops waiting: a message sent is
        # cancelled on the daemon too.
        if self._table.drop(entry):
            conn = entry.stream
            if (
                entry.sent
                and isinstance(conn, _Conn)
                and not (conn.dead or conn.unwritable)
            ):
                try:
                    conn.send(frame(wire.cancel(entry.message.id)))
                except OSError:
                    self._unwritable(conn)
            entry.waiter.fail(wire.deadline_exceeded())
        elif not entry.waiter.done:  # pragma: no cover - the table holds it
            entry.waiter.fail(wire.deadline_exceeded())

    def _read(self, conn: _Conn, waiter: _Answer, deadline: float | None) -> None:
        """Reads answers until `waiter` has its own, the connection ends, or
        `deadline` passes; then lets another caller read."""
        error: BaseException | None = None
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                try:
                    answer = conn.receive(left)
                except TimeoutError:
                    return
                with self._lock:
                    if answer.id == 0:  # the daemon ended the session
                        error = wire.SessionRpcError(answer.error)
                        return
                    found = self._table.answer(answer.id)
                    if found is not None:
                        found.waiter.set(answer)
                        self._lock.notify_all()
                    if waiter.done:
                        return
        except (OSError, EOFError, ValueError) as exc:
            error = exc if not isinstance(exc, EOFError) else None
            conn.dead = True
        finally:
            with self._lock:
                self._reading = False
                if conn.dead or error is not None:
                    self._ended(conn, error)
                self._lock.notify_all()

    def _send(self, entry: wire.Entry[_Answer]) -> None:
        # Holds the lock.
        try:
            data = frame(entry.message, self._max_bytes)
        except wire.SessionRpcError as exc:  # over the limit: not sent
            self._table.drop(entry)
            entry.waiter.fail(exc)
            return
        conn = self._conn
        if conn is None or conn.dead or conn.unwritable:
            try:
                conn = self._open()
            except OSError as exc:
                self._table.drop(entry)
                if _grpc_alone(self._grpc_socket):
                    # Its unary RPCs, for a while: the message was not sent.
                    self._unary_until = time.monotonic() + NO_FRAMES_PAUSE
                    entry.waiter.set(wire.UNARY)
                else:
                    entry.waiter.fail(not_connected(exc))
                return
        entry.stream = conn
        try:
            conn.send(data)
        except OSError:
            self._unwritable(conn)
            return
        entry.sent = True

    def _unwritable(self, conn: _Conn) -> None:
        """A write on `conn` failed: its frame was not taken (the daemon
        reads only whole frames), and the daemon had closed, or the
        connection broke. What the daemon sent before (answers, the status
        it ended the session with) is still in the socket: the connection
        ends when a waiting caller has read it to its end, and its messages
        not taken are then settled by that end (`wire.ended`). Our side is
        shut, so that a daemon still there answers what it holds and
        closes; the next message opens a new connection."""
        # Holds the lock.
        conn.unwritable = True
        self._draining.add(conn)
        if self._conn is conn:
            self._conn = None
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        self._lock.notify_all()

    def _open(self) -> _Conn:
        # Holds the lock.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self._path)
            conn = _Conn(sock, self._max_bytes)
            conn.send(frame(self._hello))
        except OSError:
            sock.close()
            raise
        self._conn = conn
        return conn

    def _ended(self, conn: _Conn, error: BaseException | None) -> None:
        # Holds the lock.
        if self._conn is conn:
            self._conn = None
        self._draining.discard(conn)
        conn.dead = True
        with contextlib.suppress(OSError):
            conn.sock.close()
        end = wire.ended(self._table, conn, error, self._closed)
        self._unary = self._unary or end.unary
        if end.pause:
            self._unary_until = time.monotonic() + end.pause
        for entry in end.fallback:
            entry.waiter.set(wire.UNARY)
        for entry, failure in end.failed:
            entry.waiter.fail(failure)
        for entry in end.again:
            self._send(entry)
        self._lock.notify_all()

    def close(self) -> None:
        """Ends the connection: the messages in flight fail as a broken
        connection's (outcome unknown), those it had not taken CANCELLED."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = [*self._draining, *([self._conn] if self._conn else [])]
            self._conn = None
            self._draining.clear()
            for entry in self._table.clear():
                entry.waiter.fail(at_close(entry.sent))
            self._lock.notify_all()
        for conn in conns:
            conn.dead = True
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
            conn.sock.close()

    def _after_fork(self) -> None:
        # The parent's connection and waiters are not this process's.
        self._reset()


# Every live session, for the fork handler (weakly).
_SESSIONS: weakref.WeakSet[FramesSession] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for session in list(_SESSIONS):
        session._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
