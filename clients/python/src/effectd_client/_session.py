"""The sync client's ledger session: one `ToolLedger.Session` stream that
carries the ledger requests of every thread using the client.

A caller puts its message on the stream's queue, which grpc's sending thread
reads as the request iterator, and waits on a lock of its own; one reader
thread takes the answers and releases the caller whose id each carries.
Many threads call at once; answers come in any order. The messages, the
table of those in flight and the errors are `effectd_client._session_wire`'s.

The stream is opened by the first call and again by the first call after it
broke. A fork gives the child an empty session (the parent's stream and
threads are not the child's); a daemon that answers the stream UNIMPLEMENTED
is asked by the unary RPCs from then on (see `_session_wire.ended` for every
end of a stream).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc
from effectd.v1 import ledger_pb2 as pb

from effectd_client import _session_wire as wire
from effectd_client._channel import Metadata

# How long close() waits for the reader thread after cancelling the stream.
_JOIN_SECONDS = 5.0


def stub_method(
    ask: Callable[[str, Any, float | None], Any],
    name: str,
    unary: Callable[..., Any],
) -> Callable[..., Any]:
    """RPC `name` called as a stub's method (`(request, timeout=,
    metadata=)`) through a sync session's `ask`; by `unary` when the session
    answers `_session_wire.UNARY`."""

    def call(request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
        answer = ask(name, request, timeout)
        if answer is wire.UNARY:
            return unary(request, timeout=timeout, metadata=metadata)
        return answer

    return call


class _Waiter:
    """One caller's wait for its answer: a lock the reader releases."""

    __slots__ = ("_done", "answer", "error")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.answer: Any = None
        self.error: Exception | None = None

    def set(self, answer: Any) -> None:
        self.answer = answer
        self._done.release()

    def fail(self, error: Exception) -> None:
        self.error = error
        self._done.release()

    def wait(self, timeout: float | None) -> bool:
        return self._done.acquire(timeout=-1 if timeout is None else max(0, timeout))


class _Stream:
    """One opened stream: the queue its request iterator reads."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.dead = False
        self.call: Any = None
        self.reader: threading.Thread | None = None


class Session:
    """The ledger session of one sync `Client` (see the module docstring)."""

    def __init__(self, channel: grpc.Channel, metadata: Metadata) -> None:
        self._open_call = channel.stream_stream(
            wire.METHOD,
            request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString,
        )
        self._metadata = metadata
        self._reset()
        self._unary = False
        # Until then (time.monotonic()), unary calls: no room for a stream.
        self._unary_until = 0.0
        self._closed = False
        _SESSIONS.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._table: wire.InFlight[_Waiter] = wire.InFlight()
        self._stream: _Stream | None = None
        self._readers: list[threading.Thread] = []

    @property
    def unary(self) -> bool:
        """Whether the daemon turned the stream down for good (see
        `_session_wire.ended`): every call is then a unary one."""
        return self._unary

    def method(self, name: str, unary: Callable[..., Any]) -> Callable[..., Any]:
        """RPC `name` called as a stub's method, through this session."""
        return stub_method(self.call, name, unary)

    def call(self, name: str, body: Any, timeout: float | None) -> Any:
        """The answer of RPC `name`, `_session_wire.UNARY` when the stream
        is not served; raises `SessionRpcError`."""
        waiter = _Waiter()
        with self._lock:
            if self._closed:
                raise wire.closed()
            if self._unary or time.monotonic() < self._unary_until:
                return wire.UNARY
            entry = self._table.add(name, body, timeout, waiter)
            self._enqueue(entry)
        if not waiter.wait(timeout):
            with self._lock:
                if self._table.drop(entry):
                    self._cancel(entry)
                    raise wire.deadline_exceeded() from None
            waiter.wait(None)  # answered while the time ran out
        if waiter.error is not None:
            raise waiter.error
        if waiter.answer is wire.UNARY:
            return wire.UNARY
        return wire.outcome(name, waiter.answer)

    def _cancel(self, entry: wire.Entry[_Waiter]) -> None:
        # Holds the lock. A message not sent yet is skipped when its turn
        # comes; one sent is cancelled on the daemon too.
        stream = entry.stream
        if entry.sent and isinstance(stream, _Stream) and not stream.dead:
            stream.queue.put(wire.cancel(entry.message.id))

    def _enqueue(self, entry: wire.Entry[_Waiter]) -> None:
        # Holds the lock.
        stream = self._stream or self._open()
        entry.stream = stream
        stream.queue.put(entry)

    def _open(self) -> _Stream:
        # Holds the lock.
        stream = _Stream()
        stream.call = self._open_call(self._requests(stream), metadata=self._metadata)
        reader = threading.Thread(
            target=self._read, args=(stream,), name="effectd-session", daemon=True
        )
        stream.reader = reader
        self._readers = [r for r in self._readers if r.is_alive()] + [reader]
        self._stream = stream
        reader.start()
        return stream

    def _requests(self, stream: _Stream) -> Iterator[Any]:
        """The request iterator grpc's sending thread reads."""
        while True:
            item = stream.queue.get()
            if item is None:
                return
            if isinstance(item, wire.Entry):
                with self._lock:
                    if stream.dead:
                        return
                    if item.stream is not stream or not self._table.pending(item):
                        continue  # its caller stopped waiting, or it moved
                    item.sent = True
                yield item.message
            else:
                yield item

    def _read(self, stream: _Stream) -> None:
        error: Exception | None = None
        try:
            for answer in stream.call:
                with self._lock:
                    entry = self._table.answer(answer.id)
                if entry is not None:
                    entry.waiter.set(answer)
        except grpc.RpcError as exc:
            error = exc
        self._ended(stream, error)

    def _ended(self, stream: _Stream, error: Exception | None) -> None:
        with self._lock:
            stream.dead = True
            stream.queue.put(None)  # ends the request iterator
            if self._stream is stream:
                self._stream = None
            end = wire.ended(self._table, stream, error, self._closed)
            self._unary = self._unary or end.unary
            if end.pause:
                self._unary_until = time.monotonic() + end.pause
            for entry in end.again:
                self._enqueue(entry)
        for entry in end.fallback:
            entry.waiter.set(wire.UNARY)
        for entry, failure in end.failed:
            entry.waiter.fail(failure)

    def close(self) -> None:
        """Ends the stream (messages in flight fail) and joins its reader."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stream, self._stream = self._stream, None
            readers = list(self._readers)
        if stream is not None:
            stream.queue.put(None)
            stream.call.cancel()
        for reader in readers:
            if reader is not threading.current_thread():
                reader.join(_JOIN_SECONDS)

    def _after_fork(self) -> None:
        # The parent's stream, reader and waiters are not this process's.
        self._reset()


def release(session: _Closes | None, channel: grpc.Channel) -> None:
    """What closing a client does: its session, then its channel."""
    if session is not None:
        session.close()
    channel.close()


class _Closes(Protocol):
    def close(self) -> None: ...


# Every live session, for the fork handler (weakly: a client closed or
# dropped is forgotten).
_SESSIONS: weakref.WeakSet[Session] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for session in list(_SESSIONS):
        session._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
