"""The retry loop of a provider call, and what one attempt can end in.

A sender (`sidecar.provider.unary`, `sidecar.provider.stream`) makes one
attempt and returns what it got: an answer the rules judge (a `Replied`, or
a stream's own kinds) or `Unanswered`. `attempt_until_done` sends attempts
under the pure rules of `sidecar.provider.policy` and the host-wide budget
and returns a union: `Answered` (the last attempt's answer, whatever its
status) or `NoAnswer` (why none came). Each `Attempt` is recorded once,
whole, after its decision; every step is told to the observer; the deadline
covers the attempts and the waits; a cancellation stops at once (§10.2
row 1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import httpx

from effectd_client import is_hop_by_hop
from sidecar.clock import Clock
from sidecar.errors import (
    RetryBudgetExhausted,
    UpstreamDeadlineExceeded,
    UpstreamFailed,
    UpstreamUnavailable,
)
from sidecar.provider import policy
from sidecar.provider.budget import RetryBudget
from sidecar.provider.messages import Attempt, Headers
from sidecar.provider.observer import ProviderObserver, RetryDetails
from sidecar.provider.policy import Cause, Outcome, Random, Stop
from sidecar.provider.prepare import Prepared

Sleep = Callable[[float], Awaitable[None]]
REQUEST_ID_HEADERS = ("x-request-id", "request-id")
# The body is answered decoded: its wire length and encoding do not apply.
_DECODED = frozenset({"content-length", "content-encoding"})


class Judged(Protocol):
    """An attempt's result as the rules and the record see it."""

    def outcome(self) -> Outcome:
        """What the rules decide on."""
        ...

    def record(self) -> Attempt:
        """The attempt's record, before the loop numbers it."""
        ...


T = TypeVar("T", bound=Judged)


class ResponseTooLarge(Exception):
    """An upstream answer larger than the sidecar forwards."""


@dataclass(frozen=True, slots=True)
class Replied:
    """An HTTP answer: a unary one read whole, or a stream's that is not 2xx
    (its body clipped to what the rules read)."""

    status: int
    headers: Headers
    received: httpx.Headers
    body: bytes
    request_id: str

    def outcome(self) -> Outcome:
        return Outcome(Cause.RESPONSE, self.status, self.received, self.body)

    def record(self) -> Attempt:
        return Attempt(
            0, Cause.RESPONSE, status=self.status, upstream_request_id=self.request_id
        )


@dataclass(frozen=True, slots=True)
class Unanswered:
    """An attempt without an HTTP answer to show: a transport failure, or the
    deadline."""

    cause: Cause
    error: str
    status: int = 0
    request_id: str = ""

    def outcome(self) -> Outcome:
        return Outcome(self.cause)

    def record(self) -> Attempt:
        return Attempt(
            0,
            self.cause,
            status=self.status,
            error=self.error,
            upstream_request_id=self.request_id,
            possibly_executed=self.cause is Cause.MAYBE_EXECUTED,
        )


@dataclass(frozen=True, slots=True)
class Tally:
    """The attempts of a call, and its retries of each kind."""

    attempts: tuple[Attempt, ...]
    retries: int
    transparent: int


@dataclass(frozen=True, slots=True)
class Answered(Generic[T]):
    """The last attempt brought an answer: `stop` says why it is the last."""

    last: T
    stop: Stop
    hint: float | None
    tally: Tally


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """No attempt brought an answer; `error` is what the agent is told."""

    stop: Stop
    hint: float | None
    tally: Tally

    def error(self, p: Prepared) -> UpstreamFailed:
        last = self.tally.attempts[-1] if self.tally.attempts else None
        meta = {
            "route": p.route.name,
            "stopReason": self.stop.value,
            "attempts": str(len(self.tally.attempts)),
            "lastError": last.error if last else "",
            "idempotencyKey": p.key,
        }
        if self.stop is Stop.DEADLINE:
            return UpstreamDeadlineExceeded(
                "no upstream answer within the deadline", meta, self.hint
            )
        if self.stop is Stop.RETRY_BUDGET_EXHAUSTED:
            # The reserve refills 1 credit per second (§10.4).
            return RetryBudgetExhausted(
                "the route's retry budget is exhausted", meta, self.hint or 1.0
            )
        return UpstreamUnavailable(
            f"no upstream answer: {meta['lastError'] or self.stop.value}",
            meta,
            self.hint,
        )


@dataclass(frozen=True, slots=True)
class Retrying:
    """The seams of the loop, injected once per daemon."""

    clock: Clock
    budget: RetryBudget
    rng: Random
    sleep: Sleep
    observer: ProviderObserver


@dataclass(slots=True)
class _Run:
    attempts: list[Attempt] = field(default_factory=list)
    retries: int = 0
    transparent: int = 0
    # The next attempt is the transparent retry of a provably unsent one.
    next_transparent: bool = False

    def record(self, draft: Attempt, *, diagnostic: str, wait: float) -> Attempt:
        attempt = Attempt(
            number=len(self.attempts) + 1,
            cause=draft.cause,
            status=draft.status,
            error=draft.error,
            wait=wait,
            upstream_request_id=draft.upstream_request_id,
            possibly_executed=draft.possibly_executed,
            transparent=self.next_transparent,
            diagnostic=diagnostic,
        )
        self.next_transparent = False
        self.attempts.append(attempt)
        return attempt

    def tally(self) -> Tally:
        return Tally(tuple(self.attempts), self.retries, self.transparent)


async def attempt_until_done(
    p: Prepared,
    seams: Retrying,
    send: Callable[[float], Awaitable[T | Unanswered]],
    *,
    stream: bool,
) -> Answered[T] | NoAnswer:
    """Sends attempts until one is final; `send` gets the seconds left."""
    try:
        return await _attempts(p, seams, send, stream=stream)
    except asyncio.CancelledError:
        seams.observer.call_cancelled(p.route.name)
        raise


async def _attempts(
    p: Prepared,
    seams: Retrying,
    send: Callable[[float], Awaitable[T | Unanswered]],
    *,
    stream: bool,
) -> Answered[T] | NoAnswer:
    name, observer, clock = p.route.name, seams.observer, seams.clock
    seams.budget.deposit(p.route.budget_key)
    run = _Run()
    while True:
        left = p.left(clock)
        if left <= 0:
            return NoAnswer(Stop.DEADLINE, None, run.tally())
        observer.attempt_started(name)
        try:
            async with asyncio.timeout(left):
                tried = await send(left)
        except TimeoutError:
            draft = Unanswered(Cause.MAYBE_EXECUTED, "deadline").record()
            observer.attempt_ended(name, run.record(draft, diagnostic="", wait=0.0))
            return NoAnswer(Stop.DEADLINE, None, run.tally())
        decided = policy.decide(
            tried.outcome(),
            retries_taken=run.retries,
            max_retries=p.max_retries,
            transparent_used=run.transparent > 0,
            replay_safe=p.replay_safe,
            time_left=p.left(clock),
            wall_now=clock.wall_ns() / 1e9,
            rng=seams.rng,
        )
        step = decided
        denied = (
            step.retry
            and not step.transparent
            and not seams.budget.withdraw(p.route.budget_key)
        )
        if denied:
            step = policy.Step(
                retry=False, stop=Stop.RETRY_BUDGET_EXHAUSTED, hint=step.hint
            )
        attempt = run.record(
            tried.record(), diagnostic=decided.diagnostic, wait=step.delay
        )
        observer.attempt_ended(name, attempt)
        if denied:
            observer.retry_denied(name)
        if not step.retry:
            stop = step.stop or Stop.NON_RETRYABLE
            if isinstance(tried, Unanswered):
                return NoAnswer(stop, step.hint, run.tally())
            return Answered(tried, stop, step.hint, run.tally())
        if step.transparent:
            run.transparent += 1
            run.next_transparent = True
        else:
            run.retries += 1
        observer.retry_scheduled(
            RetryDetails(
                route=name,
                attempt=attempt,
                wait_for=step.delay,
                waited_so_far=sum(a.wait for a in run.attempts),
                hint=step.hint,
                transparent=step.transparent,
                stream=stream,
            )
        )
        await seams.sleep(step.delay)


# -- reading an HTTP answer ----------------------------------------------------


async def read(response: httpx.Response, limit: int, *, clip: bool = False) -> bytes:
    """The answer's body, at most `limit` bytes: clipped, or refused."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > limit:
            if clip:
                return bytes(data[:limit])
            raise ResponseTooLarge(f"the answer is larger than {limit} bytes")
    return bytes(data)


def request_id(response: httpx.Response) -> str:
    for name in REQUEST_ID_HEADERS:
        if name in response.headers:
            return response.headers[name]
    return ""


def answer_headers(response: httpx.Response) -> Headers:
    """The headers an answer carries to the agent."""
    return tuple(
        (name, value)
        for name, value in response.headers.multi_items()
        if not is_hop_by_hop(name) and name.lower() not in _DECODED
    )


def replied(response: httpx.Response, body: bytes) -> Replied:
    return Replied(
        response.status_code,
        answer_headers(response),
        response.headers,
        body,
        request_id(response),
    )


def unanswered(exc: Exception, response: httpx.Response | None = None) -> Unanswered:
    """A failure without an answer to show; `response`: the head it broke
    after, when one came."""
    cause = (
        Cause.PERMANENT
        if isinstance(exc, ResponseTooLarge)
        else policy.classify_transport(exc)
    )
    if response is None:
        return Unanswered(cause, type(exc).__name__)
    return Unanswered(
        cause, type(exc).__name__, response.status_code, request_id(response)
    )


__all__ = [
    "Answered",
    "Judged",
    "NoAnswer",
    "Replied",
    "ResponseTooLarge",
    "Retrying",
    "Sleep",
    "Tally",
    "Unanswered",
    "attempt_until_done",
]
