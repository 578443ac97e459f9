"""Helpers for provider tests: a client on a manual clock and a fake sleep."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from sidecar.clock import ManualClock
from sidecar.observability.provider import ProviderMonitor
from sidecar.provider.attempts import Sleep
from sidecar.provider.budget import RetryBudget
from sidecar.provider.client import ProviderClient
from sidecar.provider.messages import Request
from sidecar.provider.observer import ProviderObserver
from sidecar.provider.routes import Route

T = TypeVar("T")
SEED = 20261202


@dataclass
class FakeSleep:
    """Sleeps by moving the manual clock; records every wait."""

    clock: ManualClock
    waits: list[float] = field(default_factory=list)
    advance: bool = True

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.advance:
            self.clock.advance(seconds)
        await asyncio.sleep(0)


def route(base_url: str, **options: object) -> Route:
    values: dict[str, object] = {
        "name": "up",
        "base_url": base_url,
        "credential_header": "Authorization",
        "credential": "Bearer sk-secret-test-key",
    }
    values.update(options)
    return Route(**values)  # type: ignore[arg-type]


def monitor() -> ProviderMonitor:
    """The daemon's observer: counters and the retry log."""
    return ProviderMonitor({}, RetryBudget(ManualClock()))


def request(**options: object) -> Request:
    values: dict[str, object] = {"route": "up", "path": "/v1/chat"}
    values.update(options)
    return Request(**values)  # type: ignore[arg-type]


def run(
    body: Callable[[ProviderClient, FakeSleep], Awaitable[T]],
    base_url: str,
    *,
    clock: ManualClock | None = None,
    seed: int = SEED,
    transport: httpx.AsyncBaseTransport | None = None,
    budget: RetryBudget | None = None,
    advance: bool = True,
    sleep: Sleep | None = None,
    observer: ProviderObserver | None = None,
    **route_options: object,
) -> T:
    """Runs `body` with a client on a manual clock, bounded to 30 s of real
    time; the client sleeps with `sleep` (default: the `FakeSleep` given to
    `body`) and reports to `observer`."""
    clock = clock or ManualClock()
    print(f"random seed {seed}")
    fake = FakeSleep(clock, advance=advance)

    async def main() -> T:
        async with transport or httpx.AsyncHTTPTransport(trust_env=False) as http:
            client = ProviderClient(
                {"up": route(base_url, **route_options)},
                http,
                clock,
                budget=budget or RetryBudget(clock),
                rng=random.Random(seed).random,  # noqa: S311 - test jitter
                sleep=sleep or fake,
                observer=observer,
            )
            return await asyncio.wait_for(body(client, fake), 30)

    return asyncio.run(main())
