"""The record of each call, however it ended: its metrics, its span (with
OpenTelemetry on) and one access log line. The gate records a call refused
before it was parsed (authentication, authorization); the boundary records
every other call once, when it has ended."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import grpc

from sidecar import tracecontext as trace
from sidecar.callstate import CallState

access_log = logging.getLogger("effectd.access")

Context = grpc.aio.ServicerContext[Any, Any]


class RpcObserver(Protocol):
    def rpc_finished(
        self, method: str, code: grpc.StatusCode, seconds: float
    ) -> None: ...

    def refused(self, reason: str) -> None: ...


class RpcTracer(Protocol):
    """Records a span per RPC (sidecar.observability.otel)."""

    def rpc_started(self, state: CallState) -> trace.TraceParent | None:
        """Starts the call's span; the context its provider requests carry."""

    def rpc_finished(self, state: CallState, code: grpc.StatusCode) -> None: ...


class Recorder:
    """Records calls to the metrics, the tracer and the access log."""

    def __init__(self, observer: RpcObserver | None, tracer: RpcTracer | None) -> None:
        self._observer = observer
        self._tracer = tracer

    def started(self, state: CallState) -> None:
        """Starts the call's span, whose context the call carries on."""
        if self._tracer is not None:
            state.trace = self._tracer.rpc_started(state)

    def names_wanted(self, *, ok: bool) -> bool:
        """Whether the access log would write the line of a call that ended
        OK (`ok`) or not: the run, call and tool it names are found only
        then (`name_the_call`), nothing else reads them."""
        return access_log.isEnabledFor(logging.DEBUG if ok else logging.INFO)

    def record(
        self,
        state: CallState,
        code: grpc.StatusCode,
        seconds: float,
        *,
        quiet: bool = False,
    ) -> None:
        """Records a call that ended with `code`; `quiet`: an end that is
        no failure whatever its code (a session stream its client closed
        between calls), logged as an answered call is."""
        if self._tracer is not None:
            self._tracer.rpc_finished(state, code)
        if self._observer is not None:
            self._observer.rpc_finished(state.method, code, seconds)
            if state.reason:
                self._observer.refused(state.reason)
        # Refusals and failures at INFO (security-relevant: a wrong token, a
        # denied role), answered calls at DEBUG: a line per call costs as
        # much as the call's own work (bench/lifecycle.py), and the metrics
        # count every call anyway.
        ok = code is grpc.StatusCode.OK or quiet
        level = logging.DEBUG if ok else logging.INFO
        if not access_log.isEnabledFor(level):
            return
        # Never the request, its payloads or the token: names and outcomes.
        access_log.log(
            level,
            "rpc",
            extra={
                "method": state.method,
                "code": code.name,
                "reason": state.reason or None,
                "namespace": state.namespace or None,
                "principal": state.principal.name if state.principal else None,
                "run": state.run or None,
                "call": state.call or None,
                "tool": state.tool or None,
                "duration_ms": round(seconds * 1000, 3),
                "trace_id": state.trace.trace_id if state.trace else None,
            },
        )


def code_of(
    ended: BaseException | None, context: Context | None = None
) -> grpc.StatusCode:
    """The status a call ended with: the one its `context` was aborted with
    or set (a session message has no context of its own); else what ended
    it, as gRPC answers it (cut off after its deadline: DEADLINE_EXCEEDED,
    before it or cancelled: CANCELLED, any other exception: UNKNOWN); else
    OK."""
    if context is not None:
        code: object = context.code()
        if isinstance(code, grpc.StatusCode):
            return code
        if isinstance(code, int):
            for candidate in grpc.StatusCode:
                if candidate.value[0] == code:
                    return candidate
    if ended is None or isinstance(ended, grpc.aio.AbortError):
        return grpc.StatusCode.OK
    if context is not None:
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            return grpc.StatusCode.DEADLINE_EXCEEDED
    # A failed write (grpc.aio.InternalError): the client had gone.
    if isinstance(ended, asyncio.CancelledError | grpc.aio.InternalError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


def name_the_call(state: CallState, request: object, answer: object) -> None:
    """Sets the run, call id and tool the call is about on `state`: those
    its request names (`ref`, `call`, `run_id`, `tool_name`), the tool else
    from the record its answer carries (`call.tool_name`)."""
    ref = _field(request, "ref") or _field(request, "call")
    run = _field(ref, "run_id") or _field(request, "run_id")
    state.run = run if isinstance(run, str) else ""
    call = _field(ref, "call_id")
    state.call = call if isinstance(call, str) else ""
    tool = _field(request, "tool_name") or _field(_field(answer, "call"), "tool_name")
    state.tool = tool if isinstance(tool, str) else ""


def _field(message: object, name: str) -> object:
    """A field of a protobuf message, if the message has it; None else."""
    descriptor = getattr(message, "DESCRIPTOR", None)
    fields = getattr(descriptor, "fields_by_name", None)
    if not fields or name not in fields:
        return None
    return getattr(message, name)
