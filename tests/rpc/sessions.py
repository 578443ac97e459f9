"""Helpers for tests of the ledger session stream: send messages on one
stream, read the answers, decode refusals as the unary tests do."""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

from sidecar.clock import ManualClock
from sidecar.composition import Services
from sidecar.config import ServeConfig
from sidecar.ledger.prepare import PrepareSpec
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.services.ledger import LedgerService
from sidecar.storage.api import Store
from sidecar.testing import RunningDaemon
from tests.rpc.support import Refusal, decode_status

T = TypeVar("T")

SESSION = "/effectd.v1.ToolLedger/Session"
Metadata = tuple[tuple[str, str], ...]

# The field of SessionRequest (and of SessionResponse) of each unary RPC.
FIELDS = {
    "PrepareTool": "prepare_tool",
    "PrepareTools": "prepare_tools",
    "StartTool": "start_tool",
    "CommitTool": "commit_tool",
    "ReportUnknown": "report_unknown",
    "Heartbeat": "heartbeat",
    "GetToolCall": "get_tool_call",
}


def message(id: int, request: Any, **fields: Any) -> pb.SessionRequest:
    """A SessionRequest carrying `request` in the field of its type."""
    name = type(request).DESCRIPTOR.name.removesuffix("Request")
    return pb.SessionRequest(id=id, **{FIELDS[name]: request}, **fields)


def exchange(
    channel: grpc.Channel,
    messages: Iterable[pb.SessionRequest],
    metadata: Metadata = (),
    timeout: float = 30,
) -> dict[int, pb.SessionResponse]:
    """Sends `messages` on one stream, half-closes it, and returns every
    answer by id (the stream must end OK)."""
    stub = ledger_pb2_grpc.ToolLedgerStub(channel)
    answers: dict[int, pb.SessionResponse] = {}
    for answer in stub.Session(
        iter(list(messages)), metadata=metadata, timeout=timeout
    ):
        assert answer.id not in answers, f"{answer.id} answered twice"
        answers[answer.id] = answer
    return answers


def answer_of(response: pb.SessionResponse) -> Any:
    """The answer a session response carries, or its refusal."""
    which = response.WhichOneof("response")
    assert which is not None, response
    if which == "error":
        return refusal(response)
    return getattr(response, which)


def refusal(response: pb.SessionResponse) -> Refusal:
    assert response.WhichOneof("response") == "error", response
    return decode_status(response.error)


class SessionRefused(grpc.RpcError):
    """Every message of a stream was refused: the first non-isolating code
    among them (else the first), and all their messages."""

    def __init__(self, refusals: Sequence[Refusal]) -> None:
        super().__init__()
        self.refusals = list(refusals)

    def code(self) -> grpc.StatusCode:
        return self.refusals[0].code

    def details(self) -> str:
        return "; ".join(r.message for r in self.refusals)


def all_refused(
    answers: dict[int, pb.SessionResponse], expected: set[grpc.StatusCode]
) -> list[pb.SessionResponse]:
    """The answers that are not a refusal with one of `expected` codes."""
    return [
        a
        for a in answers.values()
        if a.WhichOneof("response") != "error" or refusal(a).code not in expected
    ]


class Conversation:
    """One session stream that a test writes to message by message and
    reads answer by answer (a synchronous client: its requests come from a
    queue). The stream's own deadline bounds every wait."""

    def __init__(
        self, channel: grpc.Channel, metadata: Metadata = (), timeout: float = 60
    ) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        session = channel.stream_stream(
            SESSION,
            request_serializer=None,
            response_deserializer=pb.SessionResponse.FromString,
        )
        self.call: Any = session(self._requests(), metadata=metadata, timeout=timeout)

    def _requests(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def send(self, *messages: pb.SessionRequest | bytes) -> None:
        """Sends messages (or raw bytes, which may not parse)."""
        for m in messages:
            self._queue.put(m if isinstance(m, bytes) else m.SerializeToString())

    def receive(self) -> pb.SessionResponse:
        answer: pb.SessionResponse = next(self.call)
        return answer

    def close(self) -> list[pb.SessionResponse]:
        """Half-closes the stream; the answers still to come (it must end
        OK)."""
        self._queue.put(None)
        return list(self.call)

    def cancel(self) -> None:
        self.call.cancel()
        self._queue.put(None)


class Holds:
    """Holds the PrepareTool of each call whose id starts with `hold` until
    released, and counts them: entered, held now, the most held at once,
    cut off (cancelled) before release. Thread-safe: the daemon's loop
    holds, the test thread waits and releases."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.entered = 0
        self.now = 0
        self.most = 0
        self.cut = 0
        self._released = False
        self._opened: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def hold(self) -> None:
        event = asyncio.Event()
        with self._changed:
            self.entered += 1
            self.now += 1
            self.most = max(self.most, self.now)
            self._opened.append((asyncio.get_running_loop(), event))
            if self._released:
                event.set()
            self._changed.notify_all()
        try:
            await event.wait()
        except asyncio.CancelledError:
            with self._changed:
                self.cut += 1
            raise
        finally:
            with self._changed:
                self.now -= 1
                self._changed.notify_all()

    def release(self) -> None:
        """Lets every held prepare, and every later one, go on."""
        with self._changed:
            self._released = True
            for loop, event in self._opened:
                if not loop.is_closed():
                    loop.call_soon_threadsafe(event.set)

    def wait_until(
        self, predicate: Callable[[Holds], bool], timeout: float = 30
    ) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self), timeout), (
                f"entered {self.entered}, held {self.now}, cut {self.cut}"
            )


class HeldLedger:
    """The ledger service, but a prepare of a call whose id starts with
    `hold` waits for `Holds`."""

    def __init__(self, inner: LedgerService, holds: Holds) -> None:
        self._inner = inner
        self._holds = holds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def prepare(self, spec: PrepareSpec) -> Any:
        if spec.ref.call_id.startswith("hold"):
            await self._holds.hold()
        return await self._inner.prepare(spec)


class HeldDaemon(Daemon):
    """A daemon whose ledger service is a `HeldLedger`."""

    def __init__(self, config: ServeConfig, holds: Holds) -> None:
        super().__init__(config, Seams(clock=ManualClock()))
        self.holds = holds

    def compose(self, store: Store) -> Services:
        services = super().compose(store)
        held = cast(LedgerService, HeldLedger(services.ledger, self.holds))
        return dataclasses.replace(services, ledger=held)


def on_loop(running: RunningDaemon, fn: Callable[[], T]) -> T:
    """`fn()` run on the daemon's event loop (to read its state)."""

    async def call() -> T:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), running.loop).result(timeout=30)


def prepare(
    call_id: str, *, start: bool = True, run_id: str = "run"
) -> pb.PrepareToolRequest:
    return pb.PrepareToolRequest(
        ref=pb.CallRef(run_id=run_id, call_id=call_id),
        tool_name="tool",
        input=pb.Payload(json="{}"),
        start=start,
    )
