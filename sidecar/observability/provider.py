"""The daemon's observer of the provider proxy: counters and the retry log.

`ProviderMonitor` implements `sidecar.provider.observer.ProviderObserver`:
it counts attempts, retries, waits, budget denials and why calls ended
(provider-retries §10.8), per route where metrics want it, and logs every
scheduled retry before its sleep, never with a header or a body. It is
also what `sidecar.observability.collectors.ProviderCollector` reads at
scrape time, the retry credit of each route included.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.provider.observer import Attempt, RetryDetails, Stop

# The logger the retry log has always had: operators filter on its name.
log = logging.getLogger("sidecar.provider.client")

#: Every way a provider call ends: the stop reasons, and a cancellation.
STOPS = (*(s.value for s in Stop), "cancelled")


@dataclass(slots=True)
class Counters:
    """In-process counters, mutated on the event loop."""

    attempts: int = 0
    retries: int = 0
    transparent_retries: int = 0
    wait_seconds: float = 0.0
    stops: collections.Counter[str] = field(default_factory=collections.Counter)
    budget_denied: int = 0
    stream_pre_commit_retries: int = 0
    possibly_executed: int = 0
    # (route name, "attempts" | "retries" | "transparent_retries" |
    # "budget_denied") -> count: the same events per route, for metrics.
    by_route: collections.Counter[tuple[str, str]] = field(
        default_factory=collections.Counter
    )


class Keyed(Protocol):
    """A route, as far as its retry budget goes."""

    @property
    def budget_key(self) -> str: ...


class Credit(Protocol):
    """A retry budget, as far as a scrape reads it."""

    def available(self, key: str) -> float: ...


class ProviderMonitor:
    """Counts and logs what the provider's retry loop reports."""

    def __init__(self, routes: Mapping[str, Keyed], budget: Credit) -> None:
        self._routes = dict(routes)
        self._budget = budget
        self.counters = Counters()

    def credits(self) -> dict[str, float]:
        """Retry credit left in each route's upstream budget."""
        return {
            name: self._budget.available(route.budget_key)
            for name, route in self._routes.items()
        }

    def attempt_started(self, route: str) -> None:
        self.counters.attempts += 1
        self.counters.by_route[route, "attempts"] += 1

    def attempt_ended(self, route: str, attempt: Attempt) -> None:
        if attempt.possibly_executed:
            self.counters.possibly_executed += 1

    def retry_denied(self, route: str) -> None:
        self.counters.budget_denied += 1
        self.counters.by_route[route, "budget_denied"] += 1

    def retry_scheduled(self, details: RetryDetails) -> None:
        c, route = self.counters, details.route
        if details.transparent:
            c.transparent_retries += 1
            c.by_route[route, "transparent_retries"] += 1
        else:
            c.retries += 1
            c.by_route[route, "retries"] += 1
            if details.stream:
                c.stream_pre_commit_retries += 1
        c.wait_seconds += details.wait_for
        _log(details)

    def call_ended(self, route: str, stop: Stop) -> None:
        self.counters.stops[stop.value] += 1

    def call_cancelled(self, route: str) -> None:
        self.counters.stops["cancelled"] += 1


def _log(details: RetryDetails) -> None:
    attempt = details.attempt
    # Before the sleep (stamina semantics); never a header or a body.
    log.info(
        "provider retry scheduled: route=%s attempt=%d cause=%s status=%d "
        "error=%s wait=%.3fs",
        details.route,
        attempt.number + 1,
        attempt.cause.value,
        attempt.status,
        attempt.error or "-",
        details.wait_for,
        extra={
            "event": "retry_scheduled",
            "route": details.route,
            "attempt": attempt.number + 1,
            "cause": attempt.cause.value,
            "status": attempt.status,
            "error": attempt.error,
            "upstream_request_id": attempt.upstream_request_id,
            "hint": details.hint,
            "wait_for": details.wait_for,
            "waited_so_far": details.waited_so_far,
            "transparent": details.transparent,
        },
    )


__all__ = ["STOPS", "Counters", "Credit", "Keyed", "ProviderMonitor"]
