"""The state of the RPC being served: what the request boundary
(`sidecar.rpc.boundary`) records of the call, kept in a context variable for
the call's task. It lives below both the boundary and the observability
modules, which read it to record the call's span. Who the caller is, and
what it may touch, is a frozen value of its own (`sidecar.rpc.caller`)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from sidecar import tracecontext as trace
from sidecar.auth.access import Principal


@dataclass(slots=True)
class CallState:
    """What the boundary records of the call being served."""

    method: str
    principal: Principal | None
    # Event-loop time by which the call must be answered; None: no deadline.
    deadline: float | None = None
    # The ErrorInfo reason of the refusal answered, set by the error boundary.
    reason: str = ""
    namespace: str = field(default="")
    trace: trace.TraceParent | None = None
    # The tracer's span of this call, if it records one.
    span: object = None
    # The tool call the request names, for the record: its run, its call id
    # and its tool (from the request, else from the record answered); "" for
    # what it does not name.
    run: str = ""
    call: str = ""
    tool: str = ""


CURRENT: ContextVar[CallState | None] = ContextVar("effectd_call", default=None)
