"""The asyncio client's ledger session: one `ToolLedger.Session` stream
(grpc.aio) that carries the ledger requests of every task using the client.

A caller writes its message on the stream itself (one write at a time, as
grpc allows) and awaits a future; one reader task takes the answers and
completes the future whose id each carries. The messages, the table of
those in flight and the errors are `effectd_client._session_wire`'s, as for
the sync session; here everything runs on the event loop, so no lock guards
the table. `SessionCalls` is what this session and the one on the framed
transport (`effectd_client._frames_aio`) share: a caller's wait, its
deadline and its cancellation, and what the end of a stream means for the
futures of its messages.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from typing import Any

import grpc
import grpc.aio
from effectd.v1 import ledger_pb2 as pb

from effectd_client import _session_wire as wire
from effectd_client._channel import Metadata

# How long a daemon that refuses a stream takes to say so, at most.
_PROBE_SECONDS = 1.0

Waiter = asyncio.Future[Any]
# What a write on a stream that ended raises.
_ENDED = (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError)


def settle(waiter: Waiter, answer: Any) -> None:
    """Completes `waiter` with `answer`, unless its caller stopped waiting."""
    if not waiter.done():
        waiter.set_result(answer)


def fail(waiter: Waiter, error: Exception) -> None:
    """Fails `waiter` with `error`, unless its caller stopped waiting."""
    if not waiter.done():
        waiter.set_exception(error)


class SessionCalls(ABC):
    """A caller's side of an asyncio session: its message in the table, its
    wait for the answer within its deadline, and what the end of a stream
    (or connection) means for the futures of the messages it took. A
    subclass sends (`_send`) and stops a message whose caller stopped
    waiting (`_stop_waiting`)."""

    def __init__(self) -> None:
        self._table: wire.InFlight[Waiter] = wire.InFlight()
        self._unary = False
        # Until then (time.monotonic()), unary calls: no room for a stream.
        self._unary_until = 0.0
        self._closed = False
        # Readers and cancels on their way, kept until done.
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def unary(self) -> bool:
        """Whether the daemon turned the stream down for good (see
        `_session_wire.ended`): every call is then a unary one."""
        return self._unary

    @property
    def closed(self) -> bool:
        return self._closed

    def method(
        self, name: str, unary: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        """RPC `name` called as a stub's method, through this session."""

        # The signature of a grpc.aio stub's method, which this stands in for.
        async def call(
            request: Any,
            timeout: float | None = None,  # noqa: ASYNC109
            metadata: Any = None,
        ) -> Any:
            answer = await self.call(name, request, timeout)
            if answer is wire.UNARY:
                return await unary(request, timeout=timeout, metadata=metadata)
            return answer

        return call

    async def call(
        self,
        name: str,
        body: Any,
        timeout: float | None,  # noqa: ASYNC109 - also the message's timeout_ms
    ) -> Any:
        """The answer of RPC `name`, `_session_wire.UNARY` when the session
        is not served; raises `SessionRpcError`. `timeout` is the stub call's:
        the daemon gets it as the message's deadline, and the wait here ends
        with it."""
        if self._closed:
            raise wire.closed()
        if self._unary or time.monotonic() < self._unary_until:
            return wire.UNARY
        waiter: Waiter = asyncio.get_running_loop().create_future()
        entry = self._table.add(name, body, timeout, waiter)
        try:
            async with asyncio.timeout(timeout):
                await self._send(entry)
                answer = await waiter
        except TimeoutError:
            if self._stop_waiting(entry) or not waiter.done() or waiter.cancelled():
                raise wire.deadline_exceeded() from None
            answer = waiter.result()  # it came as the time ran out
        except asyncio.CancelledError:
            self._stop_waiting(entry)
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # its caller is gone: nobody reads it
            raise
        if answer is wire.UNARY:
            return wire.UNARY
        return wire.outcome(name, answer)

    @abstractmethod
    async def _send(self, entry: wire.Entry[Waiter]) -> None:
        """Sends the message of `entry`, or settles its future."""

    @abstractmethod
    def _stop_waiting(self, entry: wire.Entry[Waiter]) -> bool:
        """Forgets `entry`, whose caller stopped waiting (a message sent is
        cancelled on the daemon); whether the table still had it."""

    def _keep(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _settle_end(
        self, stream: object, error: BaseException | None
    ) -> list[wire.Entry[Waiter]]:
        """The futures of the messages `stream` carried, at its end (see
        `_session_wire.ended`); the messages it had not taken, to send again
        on a new stream (kept in the table)."""
        end = wire.ended(self._table, stream, error, self._closed)
        self._unary = self._unary or end.unary
        if end.pause:
            self._unary_until = time.monotonic() + end.pause
        for entry in end.fallback:
            settle(entry.waiter, wire.UNARY)
        for entry, failure in end.failed:
            fail(entry.waiter, failure)
        return end.again

    async def _await_tasks(self) -> None:
        """Awaits the session's readers and cancels (closing), bounded."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)


class _Stream:
    def __init__(self, call: Any) -> None:
        self.call = call
        self.write = asyncio.Lock()
        self.dead = False
        self.answered = False
        # A write refused: the stream ended while the message was being sent.
        self.refused = False
        self.over = asyncio.Event()


class AsyncSession(SessionCalls):
    """The ledger session of one `AsyncClient` (see the module docstring)."""

    def __init__(self, channel: grpc.aio.Channel, metadata: Metadata) -> None:
        super().__init__()
        # Any: the stubs of grpc.aio want a request iterator; this session
        # writes its messages itself.
        self._open_call: Any = channel.stream_stream(
            wire.METHOD,
            request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString,
        )
        self._metadata = metadata
        self._stream: _Stream | None = None

    async def _send(self, entry: wire.Entry[Waiter]) -> None:
        """Writes the message, on a new stream when its stream broke first."""
        while self._table.pending(entry) and not entry.sent:
            if self._closed:
                self._table.drop(entry)
                raise wire.closed()
            stream = self._stream or self._open()
            entry.stream = stream
            async with stream.write:
                if stream.dead or entry.stream is not stream:
                    continue
                entry.sent = True
                try:
                    await stream.call.write(entry.message)
                    continue
                except _ENDED:
                    # grpc refused the write: the message did not leave.
                    stream.refused = True
                    entry.sent = not self._table.pending(entry)
            await stream.over.wait()  # its reader settles it or frees it

    def _open(self) -> _Stream:
        stream = _Stream(self._open_call(metadata=self._metadata))
        self._keep(self._read(stream))
        self._stream = stream
        return stream

    def _stop_waiting(self, entry: wire.Entry[Waiter]) -> bool:
        if not self._table.drop(entry):
            return False
        stream = entry.stream
        if entry.sent and isinstance(stream, _Stream) and not stream.dead:
            self._keep(self._cancel(stream, entry.message.id))
        return True

    async def _cancel(self, stream: _Stream, message_id: int) -> None:
        async with stream.write:
            if stream.dead:
                return
            with suppress(*_ENDED):  # else nothing is left to cancel
                await stream.call.write(wire.cancel(message_id))

    async def _read(self, stream: _Stream) -> None:
        error: BaseException | None = None
        try:
            while True:
                answer = await stream.call.read()
                if answer is grpc.aio.EOF:  # type: ignore[attr-defined]
                    break
                stream.answered = True
                entry = self._table.answer(answer.id)
                if entry is not None:
                    settle(entry.waiter, answer)
        except grpc.RpcError as exc:
            error = exc
        except asyncio.CancelledError as exc:
            # The stream cancelled (close), or this task: settle either way.
            self._ended(stream, exc)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return
        if stream.refused and not stream.answered and not wire.refused(error):
            # A daemon that turns the stream down ends it at once; a write
            # racing that end makes its status INTERNAL: ask once more.
            error = await self._probe() or error
        self._ended(stream, error)

    async def _probe(self) -> grpc.RpcError | None:
        """The daemon's refusal of a stream, if it refuses one (within the
        probe's deadline: a daemon that serves it waits for messages)."""
        probe = self._open_call(metadata=self._metadata, timeout=_PROBE_SECONDS)
        try:
            await probe.read()
        except grpc.RpcError as exc:
            return exc if wire.refused(exc) else None
        finally:
            probe.cancel()
        return None

    def _ended(self, stream: _Stream, error: BaseException | None) -> None:
        stream.dead = True
        stream.over.set()
        if self._stream is stream:
            self._stream = None
        # A message the stream had not taken is its caller's, still in
        # `_send`, which sends it on a new stream.
        self._settle_end(stream, error)

    async def close(self) -> None:
        """Ends the stream (messages in flight fail) and awaits its reader."""
        if self._closed:
            return
        self._closed = True
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.call.cancel()
        await self._await_tasks()
