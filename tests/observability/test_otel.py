"""OpenTelemetry, the optional extra: one SERVER span per RPC through the
real daemon, parented by the caller's traceparent and parent of the provider
request's; names and outcomes only, never payloads or tokens; the SDK is not
imported unless asked for, and asking without it fails at start."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2, ledger_pb2_grpc, provider_pb2, provider_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind

import sidecar.observability
from effectd_client import Client
from effectd_client import EffectdError as ClientError
from sidecar import tracecontext as trace
from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.observability import otel
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.testing import RunningDaemon, running_daemon
from tests.observability.support import API_KEY
from tests.provider.support import FakeSleep
from tests.provider.upstream import Reply, Upstream, serving
from tests.support.tokens import (
    OBSERVED,
    OBSERVED_AGENT,
    UNKNOWN_SECRET,
    tokens_text,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
TOKEN, WRONG = OBSERVED_AGENT.secret, UNKNOWN_SECRET
MARKER = "PAYLOAD-MARKER-e3b0c442"
TOKENS = tokens_text(*OBSERVED)
SECRETS = (TOKEN, WRONG, API_KEY, MARKER)
PREPARE = "effectd.v1.ToolLedger/PrepareTool"


@contextmanager
def traced_daemon(
    tmp: Path, *script: Reply, tokens_text: str | None = None
) -> Iterator[tuple[RunningDaemon, Upstream, InMemorySpanExporter]]:
    """A daemon whose spans go to an in-memory exporter (synchronously, as
    each ends), with a provider route `up` to a scripted upstream. The spans
    are complete once the block exits (the daemon has stopped)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampling.ParentBased(sampling.ALWAYS_ON))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with serving(*script) as up:
        providers = tmp / "providers.toml"
        (tmp / "key").write_text(API_KEY)
        providers.write_text(
            f'[routes.up]\nbase_url = "{up.base_url}"\n'
            f'credential_file = "{tmp / "key"}"\npaths = ["/v1/"]\n'
        )
        config = ServeConfig(
            data_dir=tmp / "data",
            init=True,
            providers_file=providers,
            tokens_text=tokens_text,
        )
        clock = ManualClock()
        seams = Seams(
            clock=clock, backoff_sleep=FakeSleep(clock), tracer=otel.Tracing(provider)
        )
        with running_daemon(config, seams=seams) as running:
            yield running, up, exporter


def _prepare(
    target: str, call_id: str, metadata: tuple[tuple[str, str | bytes], ...] = ()
) -> None:
    with grpc.insecure_channel(target) as channel:
        ledger_pb2_grpc.ToolLedgerStub(channel).PrepareTool(
            ledger_pb2.PrepareToolRequest(
                ref=ledger_pb2.CallRef(run_id="run", call_id=call_id),
                tool_name="send",
                effect=ledger_pb2.EFFECT_SIDE_EFFECT,
                input=ledger_pb2.Payload(json=json.dumps({"body": MARKER})),
            ),
            metadata=metadata,
            timeout=30,
        )


def _named(spans: Iterable[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def assert_no_secret(
    spans: Iterable[ReadableSpan], secrets: Iterable[str] = SECRETS
) -> None:
    """No span's name, attributes, events, links or status holds a secret:
    everything an exporter would send, rendered as text."""
    text = "\n".join(s.to_json() for s in spans)
    found = [secret for secret in secrets if secret in text]
    assert not found, f"secrets in the spans: {found}"


def test_a_call_with_a_traceparent_is_a_child_span_of_it(short_tmp: Path) -> None:
    """The RPC's SERVER span is named after its method, in the caller's trace,
    parented by the caller's span, with the rpc.* attributes."""
    with traced_daemon(short_tmp) as (running, _, exporter):
        _prepare(running.target, "c1", (("traceparent", TRACEPARENT),))
    (span,) = _named(exporter.get_finished_spans(), PREPARE)
    assert span.kind is SpanKind.SERVER
    assert span.parent is not None
    assert span.parent.is_remote
    assert f"{span.parent.trace_id:032x}" == TRACE
    assert f"{span.parent.span_id:016x}" == PARENT
    assert f"{span.context.trace_id:032x}" == TRACE
    assert f"{span.context.span_id:016x}" != PARENT
    assert dict(span.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": "effectd.v1.ToolLedger",
        "rpc.method": "PrepareTool",
        "rpc.grpc.status_code": 0,
        "effectd.namespace": "default",
    }


def test_a_call_without_one_starts_a_trace(short_tmp: Path) -> None:
    """No traceparent (or an invalid one): the span is a root."""
    with traced_daemon(short_tmp) as (running, _, exporter):
        _prepare(running.target, "c1")
        _prepare(running.target, "c2", (("traceparent", TRACEPARENT.upper()),))
    spans = _named(exporter.get_finished_spans(), PREPARE)
    assert len(spans) == 2
    assert all(s.parent is None for s in spans)
    assert len({s.context.trace_id for s in spans}) == 2


def test_a_refusal_span_carries_its_reason_and_code(short_tmp: Path) -> None:
    """A handler's refusal (the same call id with other arguments) and the
    gate's (no token) each record the ErrorInfo reason and the gRPC code."""
    with traced_daemon(short_tmp, tokens_text=TOKENS) as (running, _, exporter):
        auth = (("authorization", f"Bearer {TOKEN}"),)
        _prepare(running.target, "c1", auth)
        with grpc.insecure_channel(running.target) as channel:
            stub = ledger_pb2_grpc.ToolLedgerStub(channel)
            with pytest.raises(grpc.RpcError) as mismatch:
                stub.PrepareTool(
                    ledger_pb2.PrepareToolRequest(
                        ref=ledger_pb2.CallRef(run_id="run", call_id="c1"),
                        tool_name="send",
                        effect=ledger_pb2.EFFECT_SIDE_EFFECT,
                        input=ledger_pb2.Payload(json="{}"),
                    ),
                    metadata=auth,
                    timeout=30,
                )
        with pytest.raises(grpc.RpcError) as unauthenticated:
            _prepare(running.target, "c2", (("traceparent", TRACEPARENT),))
    first, refused, denied = _named(exporter.get_finished_spans(), PREPARE)
    assert "effectd.reason" not in (first.attributes or {})
    assert (refused.attributes or {})["effectd.reason"] == "INPUT_MISMATCH"
    assert (refused.attributes or {})["rpc.grpc.status_code"] == (
        mismatch.value.code().value[0]
    )
    assert (refused.attributes or {})["effectd.namespace"] == "ns-a"
    assert (denied.attributes or {})["effectd.reason"] == "UNAUTHENTICATED"
    assert (denied.attributes or {})["rpc.grpc.status_code"] == (
        grpc.StatusCode.UNAUTHENTICATED.value[0]
    )
    assert unauthenticated.value.code() is grpc.StatusCode.UNAUTHENTICATED
    # Refused before it was served: still in the caller's trace.
    assert denied.parent is not None
    assert f"{denied.parent.span_id:016x}" == PARENT


def test_the_upstream_request_is_a_child_of_the_server_span(short_tmp: Path) -> None:
    """The provider request's traceparent names the ProviderCall span as its
    parent, in the caller's trace, with the tracestate as received."""
    with traced_daemon(short_tmp, Reply(503), Reply(200)) as (running, up, exporter):
        with grpc.insecure_channel(running.target) as channel:
            answer = provider_pb2_grpc.ProviderStub(channel).ProviderCall(
                provider_pb2.ProviderRequest(route="up", path="/v1/chat", body=b"{}"),
                metadata=(("traceparent", TRACEPARENT), ("tracestate", "v=1")),
                timeout=30,
            )
        assert answer.status == 200
    (span,) = _named(exporter.get_finished_spans(), "effectd.v1.Provider/ProviderCall")
    assert len(up.seen) == 2
    for seen in up.seen:
        sent = trace.parse_traceparent(seen.headers["traceparent"])
        assert sent is not None
        assert sent.trace_id == TRACE
        assert sent.parent_id == f"{span.context.span_id:016x}"
        assert seen.headers["tracestate"] == "v=1"
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == PARENT


def test_a_call_without_a_trace_still_joins_the_upstream_to_its_span(
    short_tmp: Path,
) -> None:
    """With spans recorded, even a call that brought no context gives the
    upstream one: its own root span's."""
    with (
        traced_daemon(short_tmp, Reply(200)) as (running, up, exporter),
        grpc.insecure_channel(running.target) as channel,
    ):
        provider_pb2_grpc.ProviderStub(channel).ProviderCall(
            provider_pb2.ProviderRequest(route="up", path="/v1/chat", body=b"{}"),
            timeout=30,
        )
    (span,) = _named(exporter.get_finished_spans(), "effectd.v1.Provider/ProviderCall")
    (seen,) = up.seen
    sent = trace.parse_traceparent(seen.headers["traceparent"])
    assert sent is not None
    assert (sent.trace_id, sent.parent_id) == (
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
    )


def test_no_span_holds_a_payload_or_a_token(short_tmp: Path) -> None:
    """Prepares, commits, a refusal, checkpoints, a provider call carrying the
    marker and the route's key, wrong and missing tokens: the spans hold
    none of them."""
    with traced_daemon(short_tmp, Reply(200), tokens_text=TOKENS) as (
        running,
        _,
        exporter,
    ):
        with Client(running.target, token=TOKEN) as client:
            first = client.prepare_tool(
                "run", "c", "send", {"body": MARKER}, start=True
            )
            client.commit_tool("run", "c", first.call.attempt, {"echo": MARKER})
            with pytest.raises(ClientError):
                client.prepare_tool("run", "c", "send", {"body": MARKER + "!"})
            client.put_checkpoint("cp", MARKER.encode())
        with grpc.insecure_channel(running.target) as channel:
            provider_pb2_grpc.ProviderStub(channel).ProviderCall(
                provider_pb2.ProviderRequest(
                    route="up",
                    path="/v1/chat",
                    body=MARKER.encode(),
                    headers=[provider_pb2.Header(name="x-note", value=MARKER)],
                ),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
                timeout=30,
            )
        for token in (WRONG, ""):
            with (
                Client(running.target, token=token) as client,
                pytest.raises(ClientError),
            ):
                client.prepare_tool("run", "d", "send", {"body": MARKER})
    spans = exporter.get_finished_spans()
    assert len(spans) >= 7
    assert_no_secret(spans)


def test_the_secret_check_catches_a_leaked_marker() -> None:
    """Negative control: a span with the marker in an attribute fails the
    same assertion."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span(PREPARE) as span:
        span.set_attribute("effectd.arguments", json.dumps({"body": MARKER}))
    with pytest.raises(AssertionError, match="secrets in the spans"):
        assert_no_secret(exporter.get_finished_spans())
    provider.shutdown()


def _imported(code: str) -> list[str]:
    """The opentelemetry modules a fresh interpreter has after `code`."""
    probe = (
        f"import json, sys\n{code}\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.startswith('opentelemetry'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_without_the_setting_the_sdk_is_not_imported() -> None:
    """`import sidecar.server` (and the CLI) loads no opentelemetry module;
    the same probe sees them once the extra's module is imported (negative
    control: the measurement can see an import)."""
    assert _imported("import sidecar.server, sidecar.cli") == []
    assert "opentelemetry.sdk.trace" in _imported("import sidecar.observability.otel")


def test_otel_without_the_extra_fails_at_start(
    short_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--otel (or EFFECTD_OTEL) where opentelemetry cannot be imported: exit
    2 before anything is bound, naming the setting as written."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "sidecar.observability.otel")
    monkeypatch.delattr(sidecar.observability, "otel")
    umask = os.umask(0o077)
    try:
        data = short_tmp / "d"
        assert main(["serve", "--data-dir", str(data), "--init", "--otel"]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            "effectd: --otel: needs the otel extra (pip install effectd[otel])"
        )
        monkeypatch.setenv("EFFECTD_OTEL", "true")
        assert main(["serve", "--data-dir", str(data), "--init"]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            "effectd: EFFECTD_OTEL: needs the otel extra (pip install effectd[otel])"
        )
    finally:
        os.umask(umask)
    assert not (data / "effectd.sock").exists()


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, ["otlp_proto_grpc"]),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ["otlp_proto_http"]),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            ["otlp_proto_http"],
        ),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp_proto_grpc"]),
    ],
)
def test_exporters_are_named_as_the_sdk_names_them(
    environ: dict[str, str], names: list[str]
) -> None:
    """OTEL_TRACES_EXPORTER (default otlp, by its protocol, default grpc)."""
    assert otel.exporter_names(environ) == names


def test_the_environment_configures_the_provider(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sampler and service name come from the SDK's variables; an
    exporter no installed package provides is named in a warning, and spans
    are then recorded and dropped."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    with caplog.at_level(logging.WARNING, logger=otel.__name__):
        tracing = otel.from_environment({"OTEL_TRACES_EXPORTER": "otlp"})
    try:
        assert tracing.provider.resource.attributes["service.name"] == "effectd"
        assert tracing.provider.sampler is sampling.ALWAYS_OFF
        assert "pip install opentelemetry-exporter-otlp-proto-grpc" in caplog.text
    finally:
        tracing.close()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agent-sidecar")
    tracing = otel.from_environment({"OTEL_TRACES_EXPORTER": "none"})
    try:
        assert tracing.provider.resource.attributes["service.name"] == "agent-sidecar"
    finally:
        tracing.close()


def test_the_setting_turns_tracing_on(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`otel = true` gives the serving daemon a Tracing; off, it has none; a
    daemon only constructed has loaded none yet."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    config = ServeConfig(data_dir=short_tmp / "d", init=True, otel=True)
    assert Daemon(config).tracing is None
    with running_daemon(config) as running:
        assert isinstance(running.daemon.tracing, otel.Tracing)
    with running_daemon(dataclasses.replace(config, otel=False)) as running:
        assert running.daemon.tracing is None
