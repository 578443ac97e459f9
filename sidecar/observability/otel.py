"""OpenTelemetry spans, the optional extra (`pip install effectd[otel]`).

With `otel` on, the gate asks `Tracing` for one SERVER span per RPC, named
after the gRPC method and parented by the caller's W3C traceparent when it
brought one. The span's own context becomes the RPC's current trace context
(`trace.CURRENT`), so a provider request forwards the span's id as its parent
and the upstream's spans join the same trace. A span holds names and outcomes
only (`rpc.*`, the namespace, the refusal's reason): never a request, a
payload or a token.

Everything else is the SDK's standard configuration, read from its own
environment variables: the sampler (`OTEL_TRACES_SAMPLER`, `..._ARG`), the
resource (`OTEL_SERVICE_NAME`, default `effectd`; `OTEL_RESOURCE_ATTRIBUTES`),
the exporters (`OTEL_TRACES_EXPORTER`, default `otlp`, and the exporter's own
`OTEL_EXPORTER_OTLP_*`), `OTEL_SDK_DISABLED`. An exporter is found through the
entry points its package registers (`otlp` needs opentelemetry-exporter-otlp,
which the extra does not bring); one that no installed package provides is
named in a warning at start, and spans are then recorded and dropped.

Importing this module imports the SDK; `sidecar.composition` imports it only when
`otel` is on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib.metadata import entry_points

import grpc
from opentelemetry import trace as api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from sidecar import tracecontext as trace
from sidecar.callstate import CallState

log = logging.getLogger(__name__)

SCOPE = "effectd"
DEFAULT_SERVICE_NAME = "effectd"
EXPORTER_GROUP = "opentelemetry_traces_exporter"
# The semantic conventions' server-side errors: the others (NOT_FOUND,
# PERMISSION_DENIED, ...) are answers the server chose, not failures.
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
# `otlp` is an alias the SDK resolves by the protocol variables.
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
_PACKAGE_OF = {
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
}


class Tracing:
    """The gate's tracer (`sidecar.rpc.recording.RpcTracer`) over one daemon's own
    TracerProvider: several daemons in a process keep theirs apart, and the
    global provider is left to the application."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer(SCOPE)

    def rpc_started(self, state: CallState) -> trace.TraceParent | None:
        """Starts the call's SERVER span, child of the caller's context; the
        span's context is what the call's provider requests carry."""
        service, _, method = state.method.lstrip("/").partition("/")
        span = self._tracer.start_span(
            state.method.lstrip("/"),
            context=_parent(state.trace),
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": method,
            },
        )
        state.span = span
        own = span.get_span_context()
        if not own.is_valid:
            # The SDK is disabled (OTEL_SDK_DISABLED): forward as without it.
            return state.trace
        return trace.TraceParent(
            trace_id=f"{own.trace_id:032x}",
            parent_id=f"{own.span_id:016x}",
            flags=f"{own.trace_flags:02x}",
            tracestate=state.trace.tracestate if state.trace else "",
            recorded=True,
        )

    def rpc_finished(self, state: CallState, code: grpc.StatusCode) -> None:
        """Ends the call's span with its outcome. A call refused before it was
        served (authentication, authorization) gets its span here."""
        span = state.span
        if not isinstance(span, api.Span):
            self.rpc_started(state)
            span = state.span
            assert isinstance(span, api.Span)
        state.span = None
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if state.namespace:
            span.set_attribute("effectd.namespace", state.namespace)
        if state.reason:
            span.set_attribute("effectd.reason", state.reason)
        if code in SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, code.name))
        span.end()

    def close(self) -> None:
        """Exports what is queued and stops the exporters."""
        self.provider.shutdown()


def _parent(context: trace.TraceParent | None) -> Context | None:
    """The caller's context as the SDK's remote parent; None: a new trace."""
    if context is None:
        return None
    state = TraceState.from_header([context.tracestate]) if context.tracestate else None
    remote = SpanContext(
        trace_id=int(context.trace_id, 16),
        span_id=int(context.parent_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(context.flags, 16)),
        trace_state=state,
    )
    return api.set_span_in_context(NonRecordingSpan(remote))


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER names (default `otlp`, resolved to
    its protocol's exporter as the SDK does); `none`: none."""
    names = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip()
    if not names or names.lower() == "none":
        return []
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    out = []
    for raw in names.split(","):
        name = raw.strip()
        if name == "otlp":
            name = _OTLP_BY_PROTOCOL.get(protocol, f"otlp ({protocol})")
        if name:
            out.append(name)
    return out


def _exporter(name: str) -> type[SpanExporter] | None:
    for point in entry_points(group=EXPORTER_GROUP, name=name):
        loaded: type[SpanExporter] = point.load()
        return loaded
    return None


def _resource() -> Resource:
    """The SDK's resource from its variables; `effectd` unless they name
    the service."""
    detected = Resource.create()
    named = str(detected.attributes.get(SERVICE_NAME, ""))
    if named and not named.startswith("unknown_service"):
        return detected
    return Resource.create({SERVICE_NAME: DEFAULT_SERVICE_NAME})


def from_environment(environ: Mapping[str, str] | None = None) -> Tracing:
    """A TracerProvider configured by the SDK's environment variables, each
    exporter behind a BatchSpanProcessor (export off the event loop)."""
    env = os.environ if environ is None else environ
    # The sampler: TracerProvider reads OTEL_TRACES_SAMPLER itself.
    provider = TracerProvider(resource=_resource())
    for name in exporter_names(env):
        exporter = _exporter(name)
        if exporter is None:
            package = _PACKAGE_OF.get(name, "a package that provides it")
            log.warning(
                "otel: no exporter %r is installed (pip install %s); spans are "
                "recorded but not exported",
                name,
                package,
            )
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter()))
    return Tracing(provider)


__all__ = ["Tracing", "exporter_names", "from_environment"]
