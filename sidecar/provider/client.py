"""The provider proxy's entry point: one retry policy over one pooled transport.

`ProviderClient.call` sends a request and reads its answer whole
(`sidecar.provider.unary`); `ProviderClient.stream` forwards server-sent
events and retries only until the first real event, the commit point
(`sidecar.provider.stream`, provider-retries §10.5). Each request is
checked and prepared once (`sidecar.provider.prepare`), then attempted
under the pure rules of `sidecar.provider.policy` and the host-wide budget
(`sidecar.provider.attempts`). The clock, the sleep, the random source and
the observer are injected at construction, so tests never sleep. Upstream
answers are data (`Answer`, `StreamEnd`); a call without any HTTP answer
raises an `UpstreamFailed`. Credentials go into upstream requests only,
never into answers, logs or errors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping

import httpx

from sidecar.clock import Clock
from sidecar.ledger.validation import Limits
from sidecar.provider import stream as streams
from sidecar.provider import unary
from sidecar.provider.attempts import Retrying, Sleep
from sidecar.provider.budget import RetryBudget
from sidecar.provider.messages import (
    Answer,
    Attempt,
    Events,
    Request,
    StreamEnd,
    StreamHead,
    StreamItem,
)
from sidecar.provider.observer import ProviderObserver, Unobserved
from sidecar.provider.policy import Random
from sidecar.provider.prepare import Prepared, prepare
from sidecar.provider.routes import Locations, Route


class ProviderClient:
    """Applies the retry policy to provider routes over a shared transport.

    Args:
        routes: the configured routes, by name.
        transport: the pooled transport every attempt goes through (an
            `httpx.AsyncHTTPTransport`; no client around it: requests are
            built whole by `Prepared.build`, and no cookie jar is shared).
        clock: time for deadlines and the budget.
        budget: the host-wide retry budget (default: a fresh one).
        rng: the jitter's random source.
        sleep: how a backoff waits.
        observer: told every attempt, retry and end (default: nobody).
        limits: the request field bounds.
    """

    def __init__(
        self,
        routes: Mapping[str, Route],
        transport: httpx.AsyncBaseTransport,
        clock: Clock,
        *,
        budget: RetryBudget | None = None,
        rng: Random,
        sleep: Sleep = asyncio.sleep,
        observer: ProviderObserver | None = None,
        limits: Limits | None = None,
    ) -> None:
        self._routes = dict(routes)
        self._transport = transport
        self._clock = clock
        self._limits = limits or Limits()
        self._locations = Locations()
        self._seams = Retrying(
            clock=clock,
            budget=budget or RetryBudget(clock),
            rng=rng,
            sleep=sleep,
            observer=observer or Unobserved(),
        )

    def _prepare(self, request: Request, time_left: float | None) -> Prepared:
        return prepare(
            self._routes,
            request,
            self._limits,
            self._clock,
            time_left,
            locations=self._locations,
        )

    async def call(self, request: Request, time_left: float | None = None) -> Answer:
        """Sends `request` with retries; `time_left` is the seconds left of
        the caller's deadline (None: 600 s), which every attempt and wait
        shares and the retry decisions read."""
        p = self._prepare(request, time_left)
        return await unary.call(self._transport, p, self._seams)

    async def stream(
        self, request: Request, time_left: float | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        """Forwards the events of `request`; retries only before the first
        real event. The last item is always a `StreamEnd`."""
        p = self._prepare(request, time_left)
        forward = streams.forward(self._transport, p, self._seams)
        async with contextlib.aclosing(forward) as items:
            async for item in items:
                yield item


__all__ = [
    "Answer",
    "Attempt",
    "Events",
    "ProviderClient",
    "Request",
    "Sleep",
    "StreamEnd",
    "StreamHead",
    "StreamItem",
]
