"""The provider proxy: W3C trace context passed upstream, and its counters
and retry budget on /metrics."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from effectd.v1 import provider_pb2 as pb
from effectd.v1 import provider_pb2_grpc

from sidecar import tracecontext as trace
from sidecar.provider.client import ProviderClient
from tests.observability.support import observed_daemon, scrape
from tests.provider.support import FakeSleep, request, run
from tests.provider.upstream import Reply, serving

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


def _call_with(
    context: trace.TraceParent | None, *script: Reply
) -> list[dict[str, str]]:
    """Sends one provider call with `context` current; the headers the
    upstream saw on each attempt."""
    with serving(*script) as up:

        async def body(client: ProviderClient, sleep: FakeSleep) -> None:
            token = trace.CURRENT.set(context)
            try:
                await client.call(request(), time_left=30)
            finally:
                trace.CURRENT.reset(token)

        run(body, up.base_url)
        return [s.headers for s in up.seen]


def test_the_upstream_joins_the_callers_trace() -> None:
    """Every attempt carries a traceparent with the caller's trace-id and
    flags and a parent-id of its own, and the tracestate as received."""
    context = trace.parse_traceparent(TRACEPARENT, "vendor=1")
    seen = _call_with(context, Reply(503), Reply(200))
    assert len(seen) == 2
    parents = set()
    for headers in seen:
        sent = trace.parse_traceparent(headers["traceparent"])
        assert sent is not None
        assert (sent.trace_id, sent.flags) == (TRACE, "01")
        assert sent.parent_id != PARENT
        parents.add(sent.parent_id)
        assert headers["tracestate"] == "vendor=1"
    # One logical request, one child: its retries share it.
    assert len(parents) == 1


def test_a_stream_carries_the_trace_too() -> None:
    """ProviderStream sends the same headers as ProviderCall."""
    events = Reply(200, events=[b"data: one\n\n", b"data: [DONE]\n\n"])
    with serving(events) as up:

        async def body(client: ProviderClient, sleep: FakeSleep) -> None:
            token = trace.CURRENT.set(trace.parse_traceparent(TRACEPARENT))
            try:
                async for _ in client.stream(request(), 30):
                    pass
            finally:
                trace.CURRENT.reset(token)

        run(body, up.base_url)
        (seen,) = up.seen
    sent = trace.parse_traceparent(seen.headers["traceparent"])
    assert sent is not None
    assert sent.trace_id == TRACE


def test_without_a_context_no_trace_header_is_sent() -> None:
    """A call that brought no trace context sends neither header."""
    (headers,) = _call_with(None, Reply(200))
    assert "traceparent" not in headers
    assert "tracestate" not in headers


def test_a_request_that_sets_its_own_traceparent_keeps_it() -> None:
    """A traceparent header the agent put in the provider request wins."""
    own = f"00-{'a' * 32}-{'b' * 16}-00"
    with serving(Reply(200)) as up:

        async def body(client: ProviderClient, sleep: FakeSleep) -> None:
            token = trace.CURRENT.set(trace.parse_traceparent(TRACEPARENT))
            try:
                await client.call(request(headers=(("traceparent", own),)), 30)
            finally:
                trace.CURRENT.reset(token)

        run(body, up.base_url)
        (seen,) = up.seen
    assert seen.headers["traceparent"] == own


@pytest.mark.parametrize(
    ("metadata", "forwarded"),
    [
        ((("traceparent", TRACEPARENT), ("tracestate", "v=1")), True),
        ((), False),
        ((("traceparent", TRACEPARENT.upper()),), False),
        ((("traceparent", f"00-{'0' * 32}-{PARENT}-01"),), False),
        ((("traceparent", TRACEPARENT + "-extra"),), False),
    ],
)
def test_grpc_metadata_traceparent_reaches_the_upstream(
    short_tmp: Path,
    metadata: tuple[tuple[str, str], ...],
    forwarded: bool,
) -> None:
    """Through a real daemon: a valid traceparent in the RPC's metadata is
    passed on (same trace-id), an invalid one is not forwarded at all."""
    with observed_daemon(short_tmp, Reply(200)) as (running, up):
        with grpc.insecure_channel(running.target) as channel:
            stub = provider_pb2_grpc.ProviderStub(channel)
            stub.ProviderCall(
                pb.ProviderRequest(route="up", path="/v1/chat", body=b"{}"),
                metadata=metadata,
                timeout=30,
            )
        (seen,) = up.seen
    if forwarded:
        sent = trace.parse_traceparent(seen.headers["traceparent"])
        assert sent is not None
        assert sent.trace_id == TRACE
        assert seen.headers["tracestate"] == "v=1"
    else:
        assert "traceparent" not in seen.headers
        assert "tracestate" not in seen.headers


def test_provider_counters_and_budget_are_scraped(short_tmp: Path) -> None:
    """After a call that needed one retry, /metrics shows two attempts and
    one backoff retry for the route, the stop reason, and its budget credit
    below the full reserve."""
    with observed_daemon(short_tmp, Reply(503), Reply(200)) as (running, _):
        with grpc.insecure_channel(running.target) as channel:
            answer = provider_pb2_grpc.ProviderStub(channel).ProviderCall(
                pb.ProviderRequest(route="up", path="/v1/chat", body=b"{}"),
                timeout=30,
            )
        assert answer.status == 200
        address = running.daemon.metrics_address
        assert address is not None
        got = scrape(address)
    assert got.value("effectd_provider_attempts_total", route="up") == 2
    assert got.value("effectd_provider_retries_total", route="up", kind="backoff") == 1
    assert (
        got.value("effectd_provider_retries_total", route="up", kind="transparent") == 0
    )
    assert got.value("effectd_provider_stops_total", reason="succeeded") == 1
    assert got.value("effectd_provider_budget_denied_total", route="up") == 0
    credit = got.value("effectd_provider_retry_budget_credits", route="up")
    # The reserve starts at 10 and the retry took one; the first attempt
    # deposited 0.2 (sidecar.provider.budget).
    assert credit is not None
    assert 9.0 <= credit < 10.0
    assert (
        got.value(
            "effectd_rpc_requests_total",
            method="effectd.v1.Provider/ProviderCall",
            code="OK",
        )
        == 1
    )
