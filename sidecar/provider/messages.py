"""The values of a provider call, wire-neutral: what goes in and comes out.

A `Request` is what an agent asked for; an `Answer` (unary) or a sequence of
`StreamItem`s ending in a `StreamEnd` (stream) is what it gets, with every
`Attempt` the sidecar made. All are frozen: an attempt is recorded once,
whole, after its decision (provider-retries §10.7). The gRPC boundary turns
them into messages; nothing here knows gRPC or httpx.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.provider.policy import Cause, Stop
from sidecar.provider.sse import Event

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Request:
    """One logical provider request, as the agent sent it."""

    route: str
    path: str
    method: str = "POST"
    headers: Headers = ()
    body: bytes = b""
    max_retries: int | None = None
    client_retry_count: int = 0
    idempotency_key: str = ""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One upstream attempt and what followed it.

    `wait` is the backoff slept after it (0 for the last); `transparent`
    marks the immediate retry of a provably unsent attempt; `diagnostic`
    records a retry hint seen and not obeyed.
    """

    number: int
    cause: Cause
    status: int = 0
    error: str = ""
    wait: float = 0.0
    upstream_request_id: str = ""
    possibly_executed: bool = False
    transparent: bool = False
    diagnostic: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """An upstream HTTP answer after the retries, whatever its status."""

    status: int
    headers: Headers
    body: bytes
    attempts: tuple[Attempt, ...]
    stop: Stop
    retry_after: float | None
    idempotency_key: str
    retries: int
    transparent_retries: int


@dataclass(frozen=True, slots=True)
class StreamHead:
    """The status and headers of the answer a stream forwards."""

    status: int
    headers: Headers


@dataclass(frozen=True, slots=True)
class Events:
    """The events of one upstream read, in order; never held for others."""

    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The last item of every stream: why it ended, and its attempts."""

    stop: Stop
    attempts: tuple[Attempt, ...]
    committed: bool
    events_delivered: int
    idempotency_key: str
    retries: int
    transparent_retries: int
    error: str = ""
    retryable: bool = False
    possibly_executed: bool = False
    retry_after: float | None = None
    body: bytes = b""


StreamItem = StreamHead | Events | StreamEnd

__all__ = [
    "Answer",
    "Attempt",
    "Events",
    "Headers",
    "Request",
    "StreamEnd",
    "StreamHead",
    "StreamItem",
]
