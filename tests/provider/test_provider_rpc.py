"""`effectd.v1.Provider` end to end: a real daemon on a Unix socket, a real
scripted upstream on 127.0.0.1, the routes from a providers file."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from effectd.v1 import provider_pb2 as pb
from effectd.v1 import provider_pb2_grpc
from google.rpc import error_details_pb2, status_pb2

from sidecar.cli import main
from sidecar.clock import Clock, ManualClock, SystemClock
from sidecar.config import ServeConfig
from sidecar.errors import RetryBudgetExhausted, UpstreamUnavailable
from sidecar.rpc.errors import to_status
from sidecar.seams import Seams
from sidecar.testing import running_daemon
from tests.provider.support import FakeSleep
from tests.provider.upstream import Reply, Upstream, serving
from tests.support.events import rpc_ended, watching

SECRET = "sk-grpc-secret-4242"


@contextmanager
def proxied(
    tmp: Path,
    *script: Reply,
    clock: Clock | None = None,
    fake_sleep: bool = True,
    frozen: bool = False,
    base_url: str | None = None,
    idempotency_key: bool = False,
) -> Iterator[tuple[provider_pb2_grpc.ProviderStub, Upstream]]:
    """A daemon whose route `up` points at a scripted upstream."""
    with serving(*script) as up:
        providers = tmp / "providers.toml"
        providers.write_text(
            f'[routes.up]\nbase_url = "{base_url or up.base_url}"\n'
            f'credential_file = "{tmp / "key"}"\n'
            f"idempotency_key = {str(idempotency_key).lower()}\n"
            'paths = ["/v1/"]\n[routes.up.headers]\n"x-injected" = "yes"\n'
        )
        (tmp / "key").write_text(SECRET)
        config = ServeConfig(data_dir=tmp / "data", providers_file=providers)
        clock = clock or ManualClock()
        seams = Seams(clock=clock)
        if fake_sleep:
            assert isinstance(clock, ManualClock)
            seams = Seams(
                clock=clock, backoff_sleep=FakeSleep(clock, advance=not frozen)
            )
        with (
            running_daemon(config, seams=seams) as running,
            grpc.insecure_channel(running.target) as channel,
        ):
            yield provider_pb2_grpc.ProviderStub(channel), up


def _request(**fields: Any) -> pb.ProviderRequest:
    values: dict[str, Any] = {"route": "up", "path": "/v1/chat", "body": b"{}"}
    values.update(fields)
    return pb.ProviderRequest(**values)


def _info(error: Any) -> tuple[str, dict[str, str], Any]:
    """The ErrorInfo reason and metadata, and the RetryInfo (or None)."""
    rich: Any = None
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            rich = status_pb2.Status.FromString(value)
    assert rich is not None
    reason, meta, retry = "", {}, None
    for detail in rich.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, meta = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
    return reason, meta, retry


def test_a_429_after_the_last_retry_is_an_answer(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three 429s answer as data: status, body, three attempts, stop
    MAX_RETRIES, the pushback trailer; the credential reached the upstream
    and appears in no answer and no log."""
    # contract §9, provider-retries §10.7
    caplog.set_level("INFO")
    busy = Reply(429, [("Retry-After", "1"), ("x-request-id", "req-1")], b"slow down")
    with proxied(short_tmp, busy, idempotency_key=True) as (stub, up):
        answer, call = stub.ProviderCall.with_call(_request(), timeout=30)
        seen = list(up.seen)
    assert (answer.status, answer.body) == (429, b"slow down")
    assert answer.stop_reason == pb.STOP_REASON_MAX_RETRIES
    assert [a.status for a in answer.attempts] == [429, 429, 429]
    assert [a.upstream_request_id for a in answer.attempts] == ["req-1"] * 3
    assert all(1.0 <= a.wait_seconds <= 1.1 for a in answer.attempts[:2])
    assert answer.retry_after_seconds == 1.0
    trailers = dict(call.trailing_metadata())
    assert trailers["grpc-retry-pushback-ms"] == "-1"
    assert trailers["x-providercall-attempts"] == "3"
    assert {s.headers["authorization"] for s in seen} == {f"Bearer {SECRET}"}
    assert {s.headers["x-injected"] for s in seen} == {"yes"}
    assert {s.headers["idempotency-key"] for s in seen} == {answer.idempotency_key}
    assert SECRET.encode() not in answer.SerializeToString()
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    ("route", "path"),
    [
        ("nope", "/v1/chat"),
        ("up", "/v1/../admin"),
        ("up", "/v1/..;/admin"),
        ("up", "/v1/%252e%252e/admin"),
        ("up", "http://169.254.169.254/latest"),
        ("up", "//evil.example/v1/"),
        ("up", "/internal"),
    ],
)
def test_nothing_but_a_route_can_be_reached(
    short_tmp: Path, route: str, path: str
) -> None:
    """Unknown routes and paths that could leave the route are
    FAILED_PRECONDITION / ROUTE_NOT_ALLOWED; nothing reaches the upstream."""
    # contract §9 "no open proxy", §11.1
    with proxied(short_tmp, Reply(200)) as (stub, up):
        with pytest.raises(grpc.RpcError) as caught:
            stub.ProviderCall(_request(route=route, path=path), timeout=30)
        assert not up.seen
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert _info(caught.value)[0] == "ROUTE_NOT_ALLOWED"


@pytest.mark.parametrize(
    "header", ["Authorization", "x-injected", "Host", "Connection"]
)
def test_requests_cannot_set_the_routes_headers(short_tmp: Path, header: str) -> None:
    """A request setting the credential, an injected or a hop-by-hop header is
    INVALID_ARGUMENT."""
    with proxied(short_tmp, Reply(200)) as (stub, up):
        req = _request(headers=[pb.Header(name=header, value="x")])
        with pytest.raises(grpc.RpcError) as caught:
            stub.ProviderCall(req, timeout=30)
        assert not up.seen
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "header",
    [
        "x-api-key",
        "api-key",
        "X-Goog-Api-Key",
        "Ocp-Apim-Subscription-Key",
        "Cookie",
    ],
)
def test_an_agents_own_credential_never_reaches_the_upstream(
    short_tmp: Path, header: str
) -> None:
    """A credential-like header the route does not set itself is dropped: the
    upstream gets the route's credential only (issue 10 item 27: fails before
    the fix: the agent's x-api-key reached an Authorization route)."""
    # contract §9 "provider API keys live in the daemon's configuration"
    with proxied(short_tmp, Reply(200)) as (stub, up):
        req = _request(headers=[pb.Header(name=header, value="sk-agent-own-key")])
        answer = stub.ProviderCall(req, timeout=30)
        [seen] = up.seen
    assert answer.status == 200
    assert header.lower() not in seen.headers
    assert "sk-agent-own-key" not in repr(seen)
    assert seen.headers["authorization"] == f"Bearer {SECRET}"


def test_redirects_are_answered_not_followed(short_tmp: Path) -> None:
    """A 302 to another host is the answer; no request follows it."""
    # contract §9 (no redirects followed to other hosts)
    moved = Reply(302, [("Location", "http://127.0.0.2:1/steal")], b"")
    with proxied(short_tmp, moved) as (stub, up):
        answer = stub.ProviderCall(_request(), timeout=30)
        assert len(up.seen) == 1
    assert answer.status == 302
    assert ("location", "http://127.0.0.2:1/steal") in [
        (h.name, h.value) for h in answer.headers
    ]


def test_no_http_answer_is_unavailable_with_pushback(short_tmp: Path) -> None:
    """A closed upstream port: UNAVAILABLE / UPSTREAM_UNAVAILABLE with the stop
    reason and attempts in ErrorInfo and `grpc-retry-pushback-ms: -1`."""
    # provider-retries §10.7 sidecar-originated failures
    with serving(Reply(200)) as gone:
        closed = gone.base_url
    with (
        proxied(short_tmp, Reply(200), base_url=closed) as (stub, _),
        pytest.raises(grpc.RpcError) as caught,
    ):
        stub.ProviderCall(_request(), timeout=30)
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    reason, meta, _ = _info(error)
    assert reason == "UPSTREAM_UNAVAILABLE"
    assert (meta["stopReason"], meta["attempts"]) == ("max_retries", "4")
    assert ("grpc-retry-pushback-ms", "-1") in tuple(error.trailing_metadata())


def test_a_known_delay_is_sent_as_retry_info() -> None:
    """An upstream failure with a known delay carries google.rpc.RetryInfo."""
    # provider-retries §10.7
    status = to_status(RetryBudgetExhausted("no credit", {"route": "up"}, 1.5))
    assert status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    [rich] = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    details = status_pb2.Status.FromString(rich).details
    retry = error_details_pb2.RetryInfo()
    assert any(d.Unpack(retry) for d in details if d.Is(retry.DESCRIPTOR))
    assert retry.retry_delay.ToMilliseconds() == 1500
    assert ("grpc-retry-pushback-ms", "-1") in status.trailing_metadata
    plain = to_status(UpstreamUnavailable("down", {}))
    assert not any(
        d.Is(retry.DESCRIPTOR)
        for k, v in plain.trailing_metadata
        if k == "grpc-status-details-bin"
        for d in status_pb2.Status.FromString(v).details
    )


def test_a_stream_forwards_events_after_a_precommit_retry(short_tmp: Path) -> None:
    """A stream that dies before its first event is retried on a default
    route; the agent gets the head with the first event, every event, then a
    StreamEnd (issue 10 item 21: fails before the fix without an
    Idempotency-Key route)."""
    # provider-retries §10.5
    good = Reply(events=[b": hi\n\n", b"data: one\n\n", b"data: two\n\n"])
    with proxied(short_tmp, Reply(events=[], break_off=True), good) as (stub, up):
        messages = list(stub.ProviderStream(_request(), timeout=30))
        assert len(up.seen) == 2
    assert messages[0].head.status == 200
    assert [e.data for m in messages for e in m.events] == ["one", "two"]
    assert not messages[1].HasField("head")
    end = messages[-1].end
    assert (end.stop_reason, end.committed, end.events_delivered) == (
        pb.STOP_REASON_SUCCEEDED,
        True,
        2,
    )
    assert [a.outcome for a in end.attempts] == [
        pb.ATTEMPT_OUTCOME_MAYBE_EXECUTED,
        pb.ATTEMPT_OUTCOME_RESPONSE,
    ]


def test_the_first_event_reaches_the_agent_before_the_upstream_sends_more(
    short_tmp: Path,
) -> None:
    """The first message (head and first event) and then the rest of the
    first read reach the agent while the upstream still holds its next
    event: nothing waits for more upstream bytes or for the whole read to
    be parsed (issue 12 item 3: the first message held the whole read)."""
    # provider.proto ProviderStreamMessage.events; provider-retries §10.5
    hold = threading.Event()
    reply = Reply(
        events=[b"data: one\n\ndata: two\n\n"], hold=hold, then=[b"data: three\n\n"]
    )
    with proxied(short_tmp, reply) as (stub, up):
        call = iter(stub.ProviderStream(_request(), timeout=30))
        first, second = next(call), next(call)
        assert not hold.is_set()
        hold.set()
        rest = list(call)
        assert len(up.seen) == 1
    assert first.head.status == 200
    assert [e.data for e in first.events] == ["one"]
    assert [e.data for e in second.events] == ["two"]
    assert [e.data for m in rest for e in m.events] == ["three"]
    assert rest[-1].end.events_delivered == 3


def test_a_stream_broken_after_its_first_event_ends_committed(
    short_tmp: Path,
) -> None:
    """After the first event a failure is a terminal message: committed, one
    event delivered, why, and no second upstream request."""
    # provider-retries §10.5 S3, §10.10 case 11
    broken = Reply(events=[b"data: one\n\n"], break_off=True)
    with proxied(short_tmp, broken, Reply(200)) as (stub, up):
        messages = list(stub.ProviderStream(_request(), timeout=30))
        assert len(up.seen) == 1
    end = messages[-1].end
    assert (end.stop_reason, end.committed, end.events_delivered) == (
        pb.STOP_REASON_COMMITTED,
        True,
        1,
    )
    assert end.error == "RemoteProtocolError"
    assert end.possibly_executed


def test_a_stream_answered_429_ends_with_the_answer(short_tmp: Path) -> None:
    """A stream whose upstream answers 429 on every attempt ends with the head
    and a StreamEnd carrying the error body: data, not a gRPC error."""
    # provider-retries §10.7
    with proxied(short_tmp, Reply(429, body=b"limit")) as (stub, _):
        messages = list(stub.ProviderStream(_request(), timeout=30))
    [only] = messages
    assert only.head.status == 429
    assert (only.end.body, only.end.stop_reason) == (
        b"limit",
        pb.STOP_REASON_MAX_RETRIES,
    )


def test_the_deadline_covers_every_attempt_on_the_wall_clock(short_tmp: Path) -> None:
    """A 2 s gRPC deadline with an upstream that never answers ends within
    the deadline plus a small margin, and the upstream request is closed."""
    # provider-retries §10.10 case 13 (real clock, real sleep)
    # A real deadline on a real socket: the wall clock is what is tested.
    with proxied(
        short_tmp, Reply(hang=True), clock=SystemClock(), fake_sleep=False
    ) as (stub, up):
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            stub.ProviderCall(_request(), timeout=2.0)
        took = time.monotonic() - start
        assert up.wait_until(lambda: up.disconnects >= 1)
        assert len(up.seen) == 1
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert took <= 2.5


def test_cancelling_the_rpc_closes_the_upstream_request(short_tmp: Path) -> None:
    """When the agent cancels, the upstream request is closed at once and no
    retry is sent."""
    # provider-retries §10.10 case 10, §10.2 row 1
    with (
        watching("effectd.access") as access,
        proxied(short_tmp, Reply(hang=True)) as (stub, up),
    ):
        future: Any = stub.ProviderCall.future(_request(), timeout=30)
        assert up.wait_until(lambda: len(up.seen) == 1)
        future.cancel()
        assert up.wait_until(lambda: up.disconnects == 1)
        # Once the call's handler has ended, no attempt can follow: the
        # recorded attempts are final.
        assert access.wait_for(rpc_ended("/effectd.v1.Provider/ProviderCall"))
        assert len(up.seen) == 1


def test_serve_refuses_an_invalid_providers_file(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectd serve --providers FILE` with an invalid file exits 2 with a
    message naming the setting."""
    bad = short_tmp / "providers.toml"
    bad.write_text('[routes.up]\nbase_url = "ftp://x"\n')
    code = main(["serve", "--data-dir", str(short_tmp / "d"), "--providers", str(bad)])
    assert code == 2
    assert "routes.up.base_url" in capsys.readouterr().err


def test_a_stream_to_no_route_fails_before_any_message(short_tmp: Path) -> None:
    """ProviderStream keeps the error boundary: a refused route is the rich
    ROUTE_NOT_ALLOWED status and no message is sent."""
    # contract §11.1
    with proxied(short_tmp, Reply(200)) as (stub, up):
        messages: list[pb.ProviderStreamMessage] = []
        with pytest.raises(grpc.RpcError) as caught:
            messages.extend(stub.ProviderStream(_request(route="nope"), timeout=30))
        assert not up.seen
    assert not messages
    assert _info(caught.value)[0] == "ROUTE_NOT_ALLOWED"


def test_a_stream_without_any_answer_is_unavailable(short_tmp: Path) -> None:
    """A stream whose upstream resets every attempt before answering sends no
    message and fails UPSTREAM_UNAVAILABLE after the retries, on a default
    route (issue 10 item 21: fails before the fix: one attempt only)."""
    # provider-retries §10.5 S0, §10.7
    with proxied(short_tmp, Reply(reset=True)) as (stub, up):
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.ProviderStream(_request(), timeout=30))
        assert len(up.seen) == 3
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    reason, meta, _ = _info(error)
    assert (reason, meta["stopReason"]) == ("UPSTREAM_UNAVAILABLE", "max_retries")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"method": "TRACE"}, "method"),
        ({"path": ""}, "path"),
        ({"path": "/v1/" + "a" * 9000}, "path"),
        ({"route": ""}, "route"),
        ({"headers": [pb.Header(name="bad name", value="x")]}, "headers[0].name"),
        (
            {"headers": [pb.Header(name="x-a", value="1\r\nHost: evil")]},
            "headers[0].value",
        ),
        (
            {"headers": [pb.Header(name=f"x-{i}", value="v") for i in range(101)]},
            "headers",
        ),
        ({"headers": [pb.Header(name="Proxy-Foo", value="v")]}, "headers[0].name"),
        ({"max_retries": 101}, "max_retries"),
        ({"client_retry_count": 101}, "client_retry_count"),
        ({"idempotency_key": "a\nb"}, "idempotency_key"),
    ],
)
def test_bad_requests_name_the_field(
    short_tmp: Path, fields: dict[str, Any], field: str
) -> None:
    """Malformed provider requests are INVALID_ARGUMENT naming the field, and
    nothing reaches the upstream."""
    # contract §11.1 (BadRequest field violations)
    with proxied(short_tmp, Reply(200)) as (stub, up):
        with pytest.raises(grpc.RpcError) as caught:
            stub.ProviderCall(_request(**fields), timeout=30)
        assert not up.seen
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    rich = status_pb2.Status.FromString(
        dict(error.trailing_metadata())["grpc-status-details-bin"]
    )
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in rich.details if d.Is(bad.DESCRIPTOR))
    assert field in [v.field for v in bad.field_violations]


@pytest.mark.parametrize("stream", [False, True], ids=["call", "stream"])
@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"headers": [pb.Header(name="x-a", value="café")]}, "headers[0].value"),
        ({"headers": [pb.Header(name="x-a", value="日本")]}, "headers[0].value"),
        # C1 and C0 controls: not a field value (RFC 9110 §5.5).
        ({"headers": [pb.Header(name="x-a", value="a\x85b")]}, "headers[0].value"),
        ({"headers": [pb.Header(name="x-a", value="a\x01b")]}, "headers[0].value"),
        ({"idempotency_key": "clé"}, "idempotency_key"),
        ({"idempotency_key": "key\u2028"}, "idempotency_key"),
        (
            {"headers": [pb.Header(name="Idempotency-Key", value="clé")]},
            "headers[0].value",
        ),
    ],
)
def test_text_http_cannot_carry_is_refused_naming_the_field(
    short_tmp: Path, fields: dict[str, Any], field: str, stream: bool
) -> None:
    """A header value or idempotency key that is not visible ASCII (with
    spaces and tabs) is INVALID_ARGUMENT naming the field, on both RPCs,
    and nothing reaches the upstream (issue 25 item 18: fails before the
    fix: INTERNAL, from the HTTP client's encoding of the header)."""
    # contract §11.1 (bad input is INVALID_ARGUMENT, never INTERNAL)
    with proxied(short_tmp, Reply(200), idempotency_key=True) as (stub, up):
        send: Any = (
            (lambda r: list(stub.ProviderStream(r, timeout=30)))
            if stream
            else (lambda r: stub.ProviderCall(r, timeout=30))
        )
        with pytest.raises(grpc.RpcError) as caught:
            send(_request(**fields))
        assert not up.seen
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error
    rich = status_pb2.Status.FromString(
        dict(error.trailing_metadata())["grpc-status-details-bin"]
    )
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in rich.details if d.Is(bad.DESCRIPTOR))
    assert [v.field for v in bad.field_violations] == [field]


def test_a_tab_and_spaces_in_a_header_value_are_sent(short_tmp: Path) -> None:
    """What HTTP allows in a field value still goes through."""
    with proxied(short_tmp, Reply(200), idempotency_key=True) as (stub, up):
        value = "a b\tc ~!"
        answer = stub.ProviderCall(
            _request(
                headers=[pb.Header(name="x-a", value=value)],
                idempotency_key="run-1:call 2",
            ),
            timeout=30,
        )
        [seen] = up.seen
    assert answer.status == 200
    assert seen.headers["x-a"] == value
    assert seen.headers["idempotency-key"] == "run-1:call 2"


def test_a_storm_through_the_daemon_stays_within_the_budget(short_tmp: Path) -> None:
    """50 concurrent ProviderCalls against an upstream answering 503: the
    daemon's host-wide budget keeps the retries ≤ 0.2·50 + 10, and every call
    still gets its 503 as an answer."""
    # provider-retries §10.10 case 12, §10.4 (the clock stands still)
    with proxied(short_tmp, Reply(503), frozen=True) as (stub, up):
        futures: list[Any] = [
            stub.ProviderCall.future(_request(), timeout=30) for _ in range(50)
        ]
        answers = [f.result() for f in futures]
        requests = len(up.seen)
    retries = sum(a.retries for a in answers)
    assert retries <= 0.2 * 50 + 10
    assert requests == 50 + retries
    assert {a.status for a in answers} == {503}
    assert pb.STOP_REASON_RETRY_BUDGET_EXHAUSTED in {a.stop_reason for a in answers}
