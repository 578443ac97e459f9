"""The pure retry rules of provider calls as truth tables (provider-retries §10)."""

from __future__ import annotations

import random
import ssl

import httpx
import pytest

from sidecar.provider import policy
from sidecar.provider.policy import Cause, Outcome, Stop

WALL = 1_700_000_000.0


def rng() -> policy.Random:
    return random.Random(7).random  # noqa: S311 - test jitter


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (408, True),  # provider-retries §10.2 row 6
        (409, True),  # provider-retries §12.2 (brief: yes)
        (425, True),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (529, True),  # Anthropic overloaded
        (599, True),
        (501, False),  # provider-retries §12.1, the safer choice
        (505, False),
        (511, False),
        (200, False),
        (301, False),
        (400, False),
        (401, False),
        (404, False),
        (422, False),
    ],
)
def test_status_table(status: int, retryable: bool) -> None:
    """Which HTTP statuses are retryable."""
    assert policy.status_retryable(status) is retryable


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        ({"retry-after-ms": "1500"}, 1.5),  # provider-retries §10.3 source 1
        ({"retry-after-ms": "1500", "retry-after": "10"}, 1.5),
        ({"retry-after-ms": "-1", "retry-after": "10"}, 10.0),  # no shadowing
        ({"retry-after-ms": "abc", "retry-after": "2"}, 2.0),
        ({"retry-after": "3"}, 3.0),  # source 2
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after": "Tue, 14 Nov 2023 22:13:40 GMT"}, 20.0),  # source 3
        ({"retry-after": "Tue, 14 Nov 2023 22:12:00 GMT"}, None),  # past
        ({"retry-after": "Fri, 29 Sep 100000 16:26:57 GMT"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "-5"}, None),
        ({"retry-after": "0"}, None),
        ({"retry-after": ""}, None),
        ({}, None),
    ],
)
def test_server_delay_table(headers: dict[str, str], delay: float | None) -> None:
    """The server's delay: first valid source wins, invalid ones are ignored."""
    # provider-retries §10.3 server_delay
    assert policy.server_delay(headers, WALL) == delay


@pytest.mark.parametrize(
    ("requested", "cap", "inbound", "effective"),
    [
        (None, 2, 0, 2),  # provider-retries §10.1 default
        (0, 2, 0, 0),  # ADR-010 R1: lowered to 0
        (1, 2, 0, 1),
        (10, 2, 0, 2),  # never raised above the cap
        (10, 4, 0, 4),  # provider-retries §10.10 case 16
        (10, 9, 0, 4),  # hard ceiling of 5 attempts
        (None, 2, 2, 0),  # provider-retries §10.10 case 15
        (None, 2, 1, 1),
        (None, 2, 7, 0),  # floored at 0
    ],
)
def test_effective_max_retries_table(
    requested: int | None, cap: int, inbound: int, effective: int
) -> None:
    """Requests only lower the cap; the agent's own retries are subtracted."""
    assert policy.effective_max_retries(requested, cap, inbound) == effective


@pytest.mark.parametrize(
    ("field", "headers", "count"),
    [
        (0, {}, 0),
        (0, {"x-stainless-retry-count": "2"}, 2),  # provider-retries §11 item 3
        (3, {"x-stainless-retry-count": "1"}, 3),
        (0, {"x-stainless-retry-count": "lots"}, 0),
    ],
)
def test_inbound_retry_count_table(
    field: int, headers: dict[str, str], count: int
) -> None:
    """The agent's retries: the field or the header, whichever is larger."""
    assert policy.inbound_retry_count(field, headers) == count


def _cert_error() -> httpx.ConnectError:
    error = httpx.ConnectError("verify failed")
    error.__context__ = ssl.SSLCertVerificationError("bad")
    return error


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (httpx.ConnectError("refused"), Cause.NEVER_SENT),  # §10.2 row 3
        (httpx.ConnectTimeout("slow"), Cause.NEVER_SENT),
        (httpx.PoolTimeout("full"), Cause.NEVER_SENT),
        (_cert_error(), Cause.PERMANENT),  # §10.2 row 4
        (httpx.LocalProtocolError("bad"), Cause.PERMANENT),
        (httpx.UnsupportedProtocol("ftp"), Cause.PERMANENT),
        (httpx.DecodingError("gzip"), Cause.PERMANENT),
        (httpx.TooManyRedirects("loop"), Cause.PERMANENT),
        (httpx.ProxyError("auth"), Cause.PERMANENT),
        (httpx.ReadTimeout("slow"), Cause.MAYBE_EXECUTED),  # §10.2 row 5
        (httpx.ReadError("reset"), Cause.MAYBE_EXECUTED),
        (httpx.WriteError("reset"), Cause.MAYBE_EXECUTED),
        (httpx.WriteTimeout("slow"), Cause.MAYBE_EXECUTED),
        (httpx.RemoteProtocolError("eof"), Cause.MAYBE_EXECUTED),
        (httpx.CloseError("close"), Cause.MAYBE_EXECUTED),
        (ValueError("other"), Cause.PERMANENT),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_transport_classification_table(error: Exception, cause: Cause) -> None:
    """Transport errors: never-sent, maybe-executed or permanent."""
    assert policy.classify_transport(error) is cause


def _decide(outcome: Outcome, **overrides: object) -> policy.Step:
    args: dict[str, object] = {
        "retries_taken": 0,
        "max_retries": 2,
        "transparent_used": False,
        "replay_safe": True,
        "time_left": 600.0,
        "wall_now": WALL,
        "rng": rng(),
    }
    args.update(overrides)
    return policy.decide(outcome, **args)  # type: ignore[arg-type]


def _http(status: int, **headers: str) -> Outcome:
    return Outcome(Cause.RESPONSE, status, headers)


@pytest.mark.parametrize(
    ("outcome", "overrides", "retry", "stop"),
    [
        (_http(200), {}, False, Stop.SUCCEEDED),
        (_http(503), {}, True, None),  # §10.2 row 6
        (_http(400), {}, False, Stop.NON_RETRYABLE),
        (_http(503, **{"x-should-retry": "false"}), {}, False, Stop.VETOED),  # row 7
        (_http(400, **{"x-should-retry": "true"}), {}, False, Stop.NON_RETRYABLE),  # 8
        (_http(503), {"retries_taken": 2}, False, Stop.MAX_RETRIES),  # row 9
        (_http(503), {"max_retries": 0}, False, Stop.MAX_RETRIES),
        (_http(429, **{"retry-after": "121"}), {}, False, Stop.RETRY_AFTER_EXCEEDS_MAX),
        (
            _http(429, **{"retry-after": "30"}),
            {"time_left": 10.0},
            False,
            Stop.DEADLINE,
        ),
        (_http(503), {"time_left": 1.2}, False, Stop.DEADLINE),  # min_attempt_budget
        (Outcome(Cause.NEVER_SENT), {}, True, None),  # transparent, row 3
        (Outcome(Cause.NEVER_SENT), {"transparent_used": True}, True, None),
        (Outcome(Cause.MAYBE_EXECUTED), {}, True, None),  # row 5
        (
            Outcome(Cause.MAYBE_EXECUTED),
            {"replay_safe": False},
            False,
            Stop.NON_RETRYABLE,
        ),
        (Outcome(Cause.PERMANENT), {}, False, Stop.NON_RETRYABLE),  # row 4
        # A side-effect route (not replay-safe), ADR-010 D1: only what the
        # upstream provably did not process is retried.
        (_http(500), {"replay_safe": False}, False, Stop.NON_RETRYABLE),
        (_http(502), {"replay_safe": False}, False, Stop.NON_RETRYABLE),
        (_http(503), {"replay_safe": False}, False, Stop.NON_RETRYABLE),
        (_http(429), {"replay_safe": False}, True, None),
        (_http(408), {"replay_safe": False}, True, None),
        (Outcome(Cause.NEVER_SENT), {"replay_safe": False}, True, None),
        (
            Outcome(Cause.ERROR_EVENT, error_type="overloaded_error"),
            {"replay_safe": False},
            False,
            Stop.NON_RETRYABLE,
        ),
        (Outcome(Cause.ERROR_EVENT, error_type="overloaded_error"), {}, True, None),
        (
            Outcome(Cause.ERROR_EVENT, error_type="invalid_request_error"),
            {},
            False,
            Stop.NON_RETRYABLE,
        ),
    ],
)
def test_decision_table(
    outcome: Outcome, overrides: dict[str, object], retry: bool, stop: Stop | None
) -> None:
    """The step after an attempt, first matching row of §10.2 wins."""
    step = _decide(outcome, **overrides)
    assert (step.retry, step.stop) == (retry, stop)


def test_the_transparent_retry_is_immediate_and_once() -> None:
    """A provably unsent attempt is retried at once, marked transparent; the
    second one is a counted retry with a backoff."""
    # provider-retries §10.2 row 3
    first = _decide(Outcome(Cause.NEVER_SENT))
    assert (first.transparent, first.delay) == (True, 0.0)
    second = _decide(Outcome(Cause.NEVER_SENT), transparent_used=True)
    assert not second.transparent
    assert 0.25 < second.delay <= 0.5


def test_jitter_survives_the_cap() -> None:
    """At k = 6 (past the 8 s cap) 1000 delays are not all equal, and all lie
    in (4, 8]."""
    # provider-retries §10.10 case 14
    draw = rng()
    delays = [policy.backoff(6, draw) for _ in range(1000)]
    assert len(set(delays)) > 1
    assert all(4.0 < d <= 8.0 for d in delays)


@pytest.mark.parametrize(
    ("k", "low", "high"),
    [(0, 0.25, 0.5), (1, 0.5, 1.0), (2, 1.0, 2.0), (3, 2.0, 4.0), (64, 4.0, 8.0)],
)
def test_backoff_schedule(k: int, low: float, high: float) -> None:
    """The default schedule: b = min(8, 0.5·2^k), delay in (b/2, b]."""
    # provider-retries §10.3
    draw = rng()
    assert all(low < policy.backoff(k, draw) <= high for _ in range(200))


def test_a_hint_is_never_undercut() -> None:
    """A server delay plus its positive jitter stays within [h, h + min(1, h/10)]."""
    # provider-retries §10.1 server-hint jitter
    draw = rng()
    for hint in (0.1, 3.0, 20.0, 100.0):
        delays = [policy.hinted_delay(hint, draw) for _ in range(200)]
        assert all(hint <= d <= hint + min(1.0, 0.1 * hint) for d in delays)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"error":{"code":"insufficient_quota"}}', "insufficient_quota"),
        (
            b'{"error":{"details":{"error_code":"enforced_spend_limit_reached"}}}',
            "enforced_spend_limit_reached",
        ),
        (b'{"error":"text"}', ""),
        (b"not json", ""),
        (b"\xff\xfe", ""),
        (b"[1,2]", ""),
    ],
)
def test_body_error_code_table(body: bytes, code: str) -> None:
    """A provider body's machine code, never an exception."""
    # provider-retries §10.2 row 6
    assert policy.body_error_code(body) == code


@pytest.mark.parametrize(
    ("event", "data", "error", "kind"),
    [
        (
            "error",
            '{"type":"error","error":{"type":"overloaded_error"}}',
            True,
            "overloaded_error",
        ),
        ("message", '{"error":{"type":"server_error"}}', True, "server_error"),
        ("message", '{"type":"error"}', True, "error"),
        ("message", '{"choices":[]}', False, "error"),
        ("message", "[DONE]", False, "error"),
    ],
)
def test_error_event_table(event: str, data: str, error: bool, kind: str) -> None:
    """Which first events are error events, and their type."""
    # provider-retries §10.5 S2
    assert policy.is_error_event(event, data) is error
    assert policy.event_error_type(data) == kind
