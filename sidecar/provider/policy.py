"""The retry rules of provider calls (provider-retries §10.2, §10.3), pure.

Functions of an attempt's outcome (status, headers, transport error), the
attempt number, the time left and an injected random source; they decide
whether a provider call is retried and after what wait. The HTTP side
(`sidecar.provider.attempts`) applies them.
"""

from __future__ import annotations

import email.utils
import enum
import json
import math
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

Random = Callable[[], float]

# provider-retries §10.1.
DEFAULT_MAX_RETRIES = 2
MAX_ATTEMPTS_CEILING = 5
BASE_SECONDS = 0.5
MULTIPLIER = 2.0
BACKOFF_CAP_SECONDS = 8.0
RETRY_AFTER_MAX_SECONDS = 120.0
MIN_ATTEMPT_SECONDS = 1.0
DEFAULT_DEADLINE_SECONDS = 600.0
ERROR_BODY_LIMIT = 64 << 10

RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
# Not transient (provider-retries §12.1, the safer choice): never retried.
PERMANENT_5XX = frozenset({501, 505, 511})
# The answers by which the upstream itself says it did not process the
# request; a 5xx may come after it did (a gateway's 502/504, a crash).
NOT_PROCESSED_STATUSES = RETRYABLE_STATUSES
# Provider body-level codes that make a retryable status permanent (§10.2 row 6).
PERMANENT_ERROR_CODES = frozenset(
    {"insufficient_quota", "enforced_spend_limit_reached"}
)
# Error event types that are transient in a stream's first event (§10.5 S2).
TRANSIENT_EVENT_ERRORS = frozenset(
    {"overloaded_error", "api_error", "server_error", "internal_server_error"}
)


class Cause(enum.Enum):
    """What an attempt's failure is, for the decision (§10.2)."""

    RESPONSE = "response"
    NEVER_SENT = "never_sent"
    MAYBE_EXECUTED = "maybe_executed"
    PERMANENT = "permanent"
    ERROR_EVENT = "error_event"


class Stop(enum.Enum):
    """Why retrying stopped (§10.7 `stop_reason`)."""

    SUCCEEDED = "succeeded"
    NON_RETRYABLE = "non_retryable"
    MAX_RETRIES = "max_retries"
    DEADLINE = "deadline"
    RETRY_AFTER_EXCEEDS_MAX = "retry_after_exceeds_max"
    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
    VETOED = "vetoed"
    COMMITTED = "committed"


def effective_max_retries(requested: int | None, cap: int, inbound: int) -> int:
    """Retries the sidecar may take: the request may only lower the route's cap,
    the hard ceiling is 5 attempts, and the agent's own retries are
    subtracted (the amplification guard, §10.2 row 9, §11 item 3)."""
    allowed = min(cap, MAX_ATTEMPTS_CEILING - 1)
    if requested is not None:
        allowed = min(allowed, requested)
    return max(0, allowed - max(0, inbound))


def inbound_retry_count(field: int, headers: Mapping[str, str]) -> int:
    """The agent's own retries: the request field or an
    `x-stainless-retry-count` header, whichever is larger."""
    raw = headers.get("x-stainless-retry-count", "").strip()
    header = int(raw) if raw.isdigit() else 0
    return max(field, header)


def status_retryable(status: int) -> bool:
    """408/409/425/429 and 5xx but 501/505/511 (§10.2 row 6, §12.1)."""
    if status in RETRYABLE_STATUSES:
        return True
    return 500 <= status <= 599 and status not in PERMANENT_5XX


def body_error_code(body: bytes) -> str:
    """A provider error body's machine code, or "" (bounded, never raises)."""
    try:
        doc = json.loads(body[:ERROR_BODY_LIMIT])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return ""
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict):
        return ""
    details = error.get("details")
    if isinstance(details, dict) and isinstance(details.get("error_code"), str):
        return str(details["error_code"])
    code = error.get("code")
    return code if isinstance(code, str) else ""


def _veto(headers: Mapping[str, str]) -> bool:
    return headers.get("x-should-retry", "").strip().lower() == "false"


def _positive(value: float) -> float | None:
    return value if math.isfinite(value) and value > 0 else None


def server_delay(headers: Mapping[str, str], wall_now: float) -> float | None:
    """The delay the server asks for in seconds, first valid source wins:
    `retry-after-ms`, `Retry-After` seconds, `Retry-After` HTTP-date
    (§10.3). Invalid, zero, negative, NaN or infinite values are ignored."""
    ms = headers.get("retry-after-ms", "").strip()
    if ms:
        try:
            found = _positive(float(ms) / 1000)
        except ValueError:
            found = None
        if found is not None:
            return found
    after = headers.get("retry-after", "").strip()
    if not after:
        return None
    try:
        return _positive(float(after))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(after)
    except (TypeError, ValueError, OverflowError, OSError, IndexError):
        return None
    try:
        return _positive(when.timestamp() - wall_now)
    except (OverflowError, OSError, ValueError):
        return None


def backoff(retries_taken: int, rng: Random) -> float:
    """Exponential backoff jittered into (b/2, b] after the cap, so the
    jitter survives saturation (§10.3)."""
    b = min(BACKOFF_CAP_SECONDS, BASE_SECONDS * MULTIPLIER ** min(retries_taken, 64))
    return b * (1 - 0.5 * rng())


def hinted_delay(hint: float, rng: Random) -> float:
    """A server delay is never undercut: + U(0, min(1 s, 10 %)) (§10.3)."""
    return hint + rng() * min(1.0, 0.1 * hint)


def classify_transport(exc: Exception) -> Cause:
    """A transport error's class (§10.2 rows 3-5)."""
    if isinstance(exc, httpx.ConnectError):
        return Cause.PERMANENT if _certificate_failure(exc) else Cause.NEVER_SENT
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return Cause.NEVER_SENT
    if isinstance(
        exc,
        httpx.LocalProtocolError
        | httpx.UnsupportedProtocol
        | httpx.InvalidURL
        | httpx.TooManyRedirects
        | httpx.DecodingError
        | httpx.ProxyError,
    ):
        return Cause.PERMANENT
    if isinstance(exc, httpx.TransportError | httpx.StreamError):
        return Cause.MAYBE_EXECUTED
    return Cause.PERMANENT


def _certificate_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_error_event(event: str, data: str) -> bool:
    """A stream event that reports an error: `event: error`, or a JSON
    payload of `"type": "error"` or with an `error` object (§10.5 S2)."""
    if event == "error":
        return True
    try:
        doc = json.loads(data[:ERROR_BODY_LIMIT])
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and (
        doc.get("type") == "error" or isinstance(doc.get("error"), dict)
    )


def event_error_type(data: str) -> str:
    """The error type of a stream's error event payload, or "error"."""
    try:
        doc = json.loads(data[:ERROR_BODY_LIMIT])
    except (ValueError, RecursionError):
        return "error"
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and isinstance(error.get("type"), str):
        return str(error["type"])
    return "error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One attempt's result, as the rules see it."""

    cause: Cause
    status: int = 0
    headers: Mapping[str, str] | None = None
    body: bytes = b""
    # The error event type of a stream's first event (Cause.ERROR_EVENT).
    error_type: str = ""


@dataclass(frozen=True, slots=True)
class Step:
    """The decision after an attempt: retry after `delay` seconds, or stop.

    `hint` is the server's delay when one was given; `transparent` marks the
    immediate, uncounted retry of a provably unsent attempt; `diagnostic`
    records a hint seen and not obeyed.
    """

    retry: bool
    delay: float = 0.0
    stop: Stop | None = None
    hint: float | None = None
    transparent: bool = False
    diagnostic: str = ""


def retryable_outcome(outcome: Outcome, replay_safe: bool) -> bool:
    """Whether the outcome itself may be retried (§10.2 rows 3-6, §12.3).

    `replay_safe` is false on a side-effect route: there an outcome after
    which the upstream may have executed the request (a transport failure
    after sending, a 5xx, a 2xx stream whose first event is an error) is not
    retried, only one it provably did not process (ADR-010 D1, D4).
    """
    if outcome.cause is Cause.RESPONSE:
        unprocessed = outcome.status in NOT_PROCESSED_STATUSES
        return (
            status_retryable(outcome.status)
            and (replay_safe or unprocessed)
            and body_error_code(outcome.body) not in PERMANENT_ERROR_CODES
        )
    if outcome.cause is Cause.ERROR_EVENT:
        return replay_safe and outcome.error_type in TRANSIENT_EVENT_ERRORS
    if outcome.cause is Cause.NEVER_SENT:
        return True
    if outcome.cause is Cause.MAYBE_EXECUTED:
        return replay_safe
    return False


def decide(  # noqa: PLR0911 - one return per row of the table
    outcome: Outcome,
    *,
    retries_taken: int,
    max_retries: int,
    transparent_used: bool,
    replay_safe: bool,
    time_left: float,
    wall_now: float,
    rng: Random,
) -> Step:
    """The next step after a failed attempt (§10.2 in order, then §10.3).

    The retry budget (§10.4) is withdrawn by the caller only when this
    answers `retry` and not `transparent`. `time_left` is seconds to the
    deadline.
    """
    headers = outcome.headers or {}
    if outcome.cause is Cause.RESPONSE and 200 <= outcome.status <= 299:
        return Step(retry=False, stop=Stop.SUCCEEDED)
    diagnostic = ""
    if headers.get("x-should-retry", "").strip().lower() == "true":
        diagnostic = "x-should-retry: true recorded, not obeyed"
    if outcome.cause is Cause.NEVER_SENT and not transparent_used:
        # §10.2 row 3: once, at once, outside max_retries and the budget.
        if time_left < MIN_ATTEMPT_SECONDS:
            return Step(retry=False, stop=Stop.DEADLINE)
        return Step(retry=True, transparent=True)
    if not retryable_outcome(outcome, replay_safe):
        return Step(retry=False, stop=Stop.NON_RETRYABLE, diagnostic=diagnostic)
    if _veto(headers):
        return Step(retry=False, stop=Stop.VETOED)
    hint = server_delay(headers, wall_now) if headers else None
    if retries_taken >= max_retries:
        return Step(
            retry=False, stop=Stop.MAX_RETRIES, hint=hint, diagnostic=diagnostic
        )
    if hint is not None and hint > RETRY_AFTER_MAX_SECONDS:
        return Step(retry=False, stop=Stop.RETRY_AFTER_EXCEEDS_MAX, hint=hint)
    delay = hinted_delay(hint, rng) if hint is not None else backoff(retries_taken, rng)
    if delay + MIN_ATTEMPT_SECONDS > time_left:
        # Never sleep past the deadline, never clamp the server's hint.
        return Step(retry=False, stop=Stop.DEADLINE, hint=hint)
    return Step(retry=True, delay=delay, hint=hint, diagnostic=diagnostic)
