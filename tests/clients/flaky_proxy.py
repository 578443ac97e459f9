"""A gRPC proxy on 127.0.0.1 in front of a real daemon that fails on cue.

`proxy.fail("CommitTool", Fault(...))` makes the next CommitTool fail: before
it reaches the daemon (a refusal, a dropped connection), or after the daemon
answered (`lost=True`: the request took effect, its answer never arrived).
Every other request, and every later one, is forwarded as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


@dataclass(frozen=True, slots=True)
class Fault:
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    reason: str = ""
    retry_delay: float | None = None
    # The daemon applied the request; only its answer is lost.
    lost: bool = False

    def status(self) -> grpc.Status:
        details = []
        if self.reason:
            info = any_pb2.Any()
            info.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain="effectd"))
            details.append(info)
        if self.retry_delay is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(int(self.retry_delay * 1e9))
            retry = any_pb2.Any()
            retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            details.append(retry)
        message = "the answer was lost" if self.lost else "injected"
        status = status_pb2.Status(
            code=self.code.value[0], message=message, details=details
        )
        return rpc_status.to_status(status)


class FlakyProxy(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    def __init__(self, upstream: str) -> None:
        self._upstream = grpc.insecure_channel(upstream)
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.Lock()
        # The short names of the methods asked for, in order.
        self.calls: list[str] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((self,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{port}"
        self._server.start()

    def fail(self, method: str, *faults: Fault) -> None:
        with self._lock:
            self._faults.setdefault(method, []).extend(faults)

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[bytes, bytes]:
        path: str = handler_call_details.method

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            name = path.rsplit("/", 1)[-1]
            with self._lock:
                self.calls.append(name)
                queue = self._faults.get(name, [])
                fault = queue.pop(0) if queue else None
            if fault is not None and not fault.lost:
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

    def close(self) -> None:
        self._server.stop(None)
        self._upstream.close()


@contextmanager
def flaky_proxy(upstream: str) -> Iterator[FlakyProxy]:
    proxy = FlakyProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
