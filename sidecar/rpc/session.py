"""The ledger session stream, `ToolLedger.Session`: translation only.

Each `SessionRequest` is served by the ToolLedger servicer's method of its
unary RPC (`sidecar.rpc.ledger`), through the request boundary's one core
(`sidecar.rpc.messages.Messages`, then `Boundary.answer`): the RPC
authorized for the stream's principal, admitted, given its deadline,
answered or refused exactly as the unary call, and recorded under its name.
Many messages are in flight at once, each answered as soon as it is done;
one writer sends the answers.

At most `max_in_flight` messages of a stream are in flight at once (being
served, or their answer waiting for the writer): the reader waits for room
before it reads the next one, so past the limit the client is held back by
gRPC's flow control. A message that does not parse
(its id cannot be known) ends the stream INVALID_ARGUMENT once the messages
in flight are answered; a client that goes away cancels the messages in
flight, as gRPC cancels a unary handler (what committed stays committed).
When the daemon stops (`Draining`), the messages in flight are answered,
each message read after it is refused SHUTTING_DOWN, and the stream ends
UNAVAILABLE once none is in flight.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb

from sidecar.errors import EffectdError, FieldViolation, InvalidArgument, ShuttingDown
from sidecar.rpc.boundary import Refused, Unparsed
from sidecar.rpc.errors import details_of, plain_status, to_status
from sidecar.rpc.messages import Messages

SESSION = "/effectd.v1.ToolLedger/Session"

Context = grpc.aio.ServicerContext[Any, Any]
Serve = Callable[[Any, Context], Awaitable[Any]]

_CANCELLED = plain_status(
    grpc.StatusCode.CANCELLED, "cancelled by the client's SessionCancel"
)


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of message: the unary RPC that serves it, and the field of
    `SessionResponse` its answer goes in."""

    method: str
    serve: Serve
    # The field of SessionRequest that holds its request.
    request: str
    answer: str


def kinds(servicer: object) -> dict[str, Kind]:
    """The kinds of `SessionRequest.request`, by field name, each matched
    to the ToolLedger RPC of its request type and the `SessionResponse`
    field of that RPC's response type (read from the descriptors once)."""
    service = pb.DESCRIPTOR.services_by_name["ToolLedger"]
    by_input = {
        m.input_type.full_name: m for m in service.methods if not m.client_streaming
    }
    answers = {
        f.message_type.full_name: f.name
        for f in pb.SessionResponse.DESCRIPTOR.oneofs_by_name["response"].fields
        if f.message_type is not None
    }
    found = {}
    for field in pb.SessionRequest.DESCRIPTOR.oneofs_by_name["request"].fields:
        method = (
            by_input.get(field.message_type.full_name)
            if field.message_type is not None
            else None
        )
        if method is None:
            continue  # cancel: not a request of its own
        found[field.name] = Kind(
            f"/{service.full_name}/{method.name}",
            getattr(servicer, method.name),
            field.name,
            answers[method.output_type.full_name],
        )
    return found


class Draining:
    """Whether the daemon has begun to stop: session streams then answer
    what they have in flight and end."""

    def __init__(self) -> None:
        self._begun = asyncio.Event()

    @property
    def begun(self) -> bool:
        return self._begun.is_set()

    def begin(self) -> None:
        self._begun.set()

    async def wait(self) -> None:
        await self._begun.wait()


class LedgerSession:
    """The servicer of `ToolLedger.Session`, over the ToolLedger servicer
    whose methods serve its messages."""

    def __init__(
        self, ledger: object, *, max_in_flight: int, draining: Draining
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._kinds = kinds(ledger)
        self._max_in_flight = max_in_flight
        self._draining = draining

    async def Session(
        self, requests: AsyncIterator[Any], context: Context, messages: Messages
    ) -> Refused | None:
        """Serves one stream until it ends; the refusal it ends with, if
        any (the boundary ends the stream with it)."""
        stream = _Stream(
            self._kinds, context, messages, self._max_in_flight, self._draining
        )
        return await stream.serve(requests)


class _Stream:
    """One stream's messages in flight, its room and its writer."""

    def __init__(
        self,
        kinds: dict[str, Kind],
        context: Context,
        messages: Messages,
        max_in_flight: int,
        draining: Draining,
    ) -> None:
        self._kinds = kinds
        self._context = context
        self._messages = messages
        # Taken before a message is read, given back once its answer is
        # written (or it is one not answered: a cancel).
        self._room = asyncio.Semaphore(max_in_flight)
        self._unanswered = 0
        # Answers handed to gRPC and not yet written: answered, for a stream
        # its client ends (`Messages.cut`), though the writer still waits.
        self._writing = 0
        self._all_answered = asyncio.Event()
        self._all_answered.set()
        # Answers waiting for the one writer, in the order they were done.
        self._outbox: collections.deque[pb.SessionResponse] = collections.deque()
        self._posted = asyncio.Event()
        # The tasks of messages being served, by id; the ids the client
        # cancelled among them.
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        self._cancelled: set[int] = set()
        self._draining = draining

    async def serve(self, requests: AsyncIterator[Any]) -> Refused | None:
        reader = asyncio.create_task(self._read(requests))
        writer = asyncio.create_task(self._write())
        stopping = asyncio.create_task(self._draining.wait())
        try:
            await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            ended = None if stopping.done() else reader.result()
            await self._all_answered.wait()
            error: EffectdError
            if stopping.done():
                error = ShuttingDown("the daemon is stopping; open a new stream")
                return Refused(to_status(error), error.reason)
            if ended is not None:
                error = InvalidArgument([FieldViolation("", str(ended))])
                return Refused(to_status(error), error.reason)
            return None
        finally:
            # The client went (gRPC cancelled this task), or the stream
            # ends: nothing of it outlives it.
            self._messages.cut = self._unanswered - self._writing
            pending = [reader, writer, stopping, *self._in_flight.values()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[Any]) -> Unparsed | None:
        """Reads until the client half-closes (None) or a message does not
        parse (that one), taking room for each message first."""
        items = aiter(requests)
        while True:
            await self._room.acquire()
            try:
                request = await anext(items)
            except StopAsyncIteration:
                self._room.release()
                return None
            if isinstance(request, Unparsed):
                self._room.release()
                return request
            self._take(request)

    def _take(self, request: pb.SessionRequest) -> None:
        """Starts serving one message, or answers it at once; the room
        taken for it is given back once it is answered."""
        which = request.WhichOneof("request")
        if which == "cancel":
            self._room.release()
            self._cancel(request.id)
            return
        self._unanswered += 1
        self._all_answered.clear()
        kind = self._kinds.get(which) if which is not None else None
        if kind is None:
            empty = FieldViolation("request", "is required: one of the ledger requests")
            error = details_of(to_status(InvalidArgument([empty])))
            self._post(pb.SessionResponse(id=request.id, error=error))
            return
        if request.id in self._in_flight or self._draining.begun:
            refused = self._messages.refuse(
                kind.method, self._refusal(request.id), request.traceparent
            )
            error = details_of(refused.status)
            self._post(pb.SessionResponse(id=request.id, error=error))
            return
        self._in_flight[request.id] = asyncio.create_task(self._serve(request, kind))

    def _refusal(self, id: int) -> EffectdError:
        """Why a message is refused before it is served."""
        if id in self._in_flight:
            return InvalidArgument([FieldViolation("id", f"{id} is in flight already")])
        return ShuttingDown("the daemon is stopping; open a new stream")

    def _cancel(self, id: int) -> None:
        task = self._in_flight.get(id)
        if task is not None and id not in self._cancelled:
            self._cancelled.add(id)
            # After the task's first step, never before it: a task cancelled
            # before it starts never runs `_serve`, whose `finally` and answer
            # give the message's room back (a request and its cancel read in
            # one go). The first step was scheduled when the task was made.
            asyncio.get_running_loop().call_soon(task.cancel)

    async def _serve(self, request: pb.SessionRequest, kind: Kind) -> None:
        id = request.id
        inner = getattr(request, kind.request)
        try:
            answer = await self._messages.answer(
                kind.method,
                inner,
                lambda: kind.serve(inner, self._context),
                timeout_ms=request.timeout_ms,
                traceparent=request.traceparent,
            )
        except asyncio.CancelledError:
            if id not in self._cancelled:
                raise
            answer = Refused(_CANCELLED, "")
        finally:
            del self._in_flight[id]
            self._cancelled.discard(id)
        if isinstance(answer, Refused):
            self._post(pb.SessionResponse(id=id, error=details_of(answer.status)))
        else:
            self._post(pb.SessionResponse(id=id, **{kind.answer: answer}))

    def _post(self, response: pb.SessionResponse) -> None:
        self._outbox.append(response)
        self._posted.set()

    async def _write(self) -> None:
        """The one writer: sends the answers one at a time (gRPC's writes
        must not interleave), each message's room given back once its
        answer is written. A client that has gone is not written to: its
        stream is being torn down."""
        outbox, context = self._outbox, self._context
        while True:
            if not outbox:
                self._posted.clear()
                await self._posted.wait()
                continue
            self._writing = 1
            try:
                await context.write(outbox.popleft())
            except grpc.aio.BaseError:
                pass
            finally:
                self._writing = 0
                self._room.release()
                self._unanswered -= 1
                if not self._unanswered:
                    self._all_answered.set()
