"""A gRPC proxy on 127.0.0.1 in front of a real daemon that fails on cue.

`proxy.fail("CommitTool", Fault(...))` makes the next CommitTool fail: before
it reaches the daemon (a refusal, a dropped connection), or after the daemon
answered (`lost=True`: the request took effect, its answer never arrived;
`applied=True`: it took effect, and the fault's status is the answer, as a
daemon answers a COMMIT whose outcome it could not learn).
Every other request, and every later one, is forwarded as it is.

The proxy serves the ledger session stream too, each of its messages
forwarded as its unary RPC (in a thread of its own, so answers come back in
the order they are done): a refusal is that message's `error`, and a lost
answer breaks the whole stream (UNAVAILABLE) once the daemon has applied
it, as a connection lost would. `Fault(stall=True)` never answers the
message (the client's deadline passes; its `cancel` is recorded in
`cancels`), and `reorder(n)` holds answers until `n` are ready, then sends
them in the reverse order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from effectd_client._session_wire import FIELDS

SESSION = "/effectd.v1.ToolLedger/Session"
# The unary RPC of each kind of session message.
_NAMES = {field: name for name, field in FIELDS.items()}
_END, _BREAK = object(), object()


def _status_of(error: Any) -> status_pb2.Status:
    """The google.rpc.Status of a failed unary call, as the daemon sent it."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    return status_pb2.Status(code=error.code().value[0], message=error.details())


@dataclass(frozen=True, slots=True)
class Fault:
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    reason: str = ""
    retry_delay: float | None = None
    # The daemon applied the request; only its answer is lost.
    lost: bool = False
    # The daemon applied the request and answered with this status.
    applied: bool = False
    # ErrorInfo metadata (with `reason`), e.g. mayHaveBeenApplied.
    metadata: tuple[tuple[str, str], ...] = ()
    # Session messages only: never answered; or the stream breaks before
    # the request is forwarded.
    stall: bool = False
    broken: bool = False

    def status(self) -> grpc.Status:
        return rpc_status.to_status(self.proto())

    def proto(self) -> status_pb2.Status:
        details = []
        if self.reason:
            info = any_pb2.Any()
            info.Pack(
                error_details_pb2.ErrorInfo(
                    reason=self.reason, domain="effectd", metadata=dict(self.metadata)
                )
            )
            details.append(info)
        if self.retry_delay is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(int(self.retry_delay * 1e9))
            retry = any_pb2.Any()
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            details.append(retry)
        message = "the answer was lost" if self.lost else "injected"
        return status_pb2.Status(
            code=self.code.value[0], message=message, details=details
        )


class FlakyProxy(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    def __init__(self, upstream: str, *, session: bool = True) -> None:
        # False: the proxy is a daemon older than the stream (UNIMPLEMENTED).
        self._serves_session = session
        self._upstream = grpc.insecure_channel(upstream)
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.Lock()
        # The short names of the methods asked for, in order.
        self.calls: list[str] = []
        # The ids of the session messages the client cancelled, in order.
        self.cancels: list[int] = []
        # How many session streams the clients opened.
        self.sessions = 0
        self._streams: list[queue.SimpleQueue[Any]] = []
        self._reorder = 1
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers((self,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{port}"
        self._server.start()

    def fail(self, method: str, *faults: Fault) -> None:
        with self._lock:
            self._faults.setdefault(method, []).extend(faults)

    def reorder(self, n: int) -> None:
        """Session answers from now on go out `n` at a time, last done first."""
        with self._lock:
            self._reorder = n

    def break_streams(self) -> None:
        """Breaks every open session stream now (UNAVAILABLE)."""
        with self._lock:
            streams = list(self._streams)
        for answers in streams:
            answers.put(_BREAK)

    def _fault(self, name: str) -> Fault | None:
        with self._lock:
            self.calls.append(name)
            queue = self._faults.get(name, [])
            return queue.pop(0) if queue else None

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        path: str = handler_call_details.method
        if path == SESSION:
            self.sessions += 1
            if not self._serves_session:
                return None  # type: ignore[return-value]
            return grpc.stream_stream_rpc_method_handler(
                self._session,
                request_deserializer=pb.SessionRequest.FromString,
                response_serializer=pb.SessionResponse.SerializeToString,
            )

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            fault = self._fault(path.rsplit("/", 1)[-1])
            if fault is not None and not (fault.lost or fault.applied):
                context.abort_with_status(fault.status())
            try:
                answer: bytes = self._upstream.unary_unary(path, None, None)(
                    request, timeout=context.time_remaining()
                )
            except grpc.RpcError as exc:
                failed: Any = exc
                context.set_trailing_metadata(failed.trailing_metadata())
                context.abort(failed.code(), failed.details())
            if fault is not None:
                context.abort_with_status(fault.status())
            return answer

        return grpc.unary_unary_rpc_method_handler(forward)

    def _session(
        self, requests: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._lock:
            self._streams.append(answers)
        threading.Thread(target=self._take, args=(requests, answers)).start()
        held: list[Any] = []
        try:
            while (answer := answers.get()) is not _END:
                if answer is _BREAK:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the stream broke")
                held.append(answer)
                with self._lock:
                    n = self._reorder
                if len(held) >= n:
                    yield from reversed(held)
                    held.clear()
            yield from held
        finally:
            with self._lock:
                self._streams.remove(answers)

    def _take(self, requests: Iterator[Any], answers: queue.SimpleQueue[Any]) -> None:
        """Reads the stream's messages, each served in a thread of its own."""
        serving: list[threading.Thread] = []
        with suppress(grpc.RpcError):
            for message in requests:
                if message.WhichOneof("request") == "cancel":
                    with self._lock:
                        self.cancels.append(message.id)
                    continue
                work = threading.Thread(target=self._serve, args=(message, answers))
                work.start()
                serving.append(work)
        for work in serving:
            work.join()
        answers.put(_END)

    def _serve(self, message: Any, answers: queue.SimpleQueue[Any]) -> None:
        field = message.WhichOneof("request")
        name = _NAMES[field]
        fault = self._fault(name)
        if fault is not None and fault.stall:
            return
        if fault is not None and fault.broken:
            answers.put(_BREAK)
            return
        if fault is not None and not (fault.lost or fault.applied):
            answers.put(pb.SessionResponse(id=message.id, error=fault.proto()))
            return
        unary = getattr(ledger_pb2_grpc.ToolLedgerStub(self._upstream), name)
        try:
            answer = unary(
                getattr(message, field), timeout=message.timeout_ms / 1000 or None
            )
        except grpc.RpcError as exc:
            answers.put(pb.SessionResponse(id=message.id, error=_status_of(exc)))
            return
        if fault is not None and fault.applied:
            answers.put(pb.SessionResponse(id=message.id, error=fault.proto()))
            return
        if fault is not None:
            answers.put(_BREAK)
            return
        reply = pb.SessionResponse(id=message.id)
        getattr(reply, field).CopyFrom(answer)
        answers.put(reply)

    def close(self) -> None:
        self.break_streams()
        self._server.stop(None)
        self._upstream.close()


@contextmanager
def flaky_proxy(upstream: str, *, session: bool = True) -> Iterator[FlakyProxy]:
    proxy = FlakyProxy(upstream, session=session)
    try:
        yield proxy
    finally:
        proxy.close()
