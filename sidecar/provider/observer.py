"""What a provider call reports as it runs, for whoever counts or logs it.

The retry loop calls a `ProviderObserver` at each step: an attempt started
and ended, a retry refused by the budget or scheduled (before its sleep, as
stamina's retry hooks are), a call ended or cancelled. The observer is
injected at construction; the daemon's (`sidecar.observability.provider`)
keeps the counters behind /metrics and logs every scheduled retry. The
values it receives are frozen and never carry a header, a body or a
credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sidecar.provider.messages import Attempt
from sidecar.provider.policy import Cause, Stop


@dataclass(frozen=True, slots=True)
class RetryDetails:
    """A retry about to wait (provider-retries §10.8 `retry_scheduled`).

    `attempt` is the attempt that failed, its `wait` set; `waited_so_far`
    includes that wait. `transparent`: the immediate, uncounted retry of a
    provably unsent attempt. `stream`: a stream's retry before its commit
    point.
    """

    route: str
    attempt: Attempt
    wait_for: float
    waited_so_far: float
    hint: float | None
    transparent: bool
    stream: bool


class ProviderObserver(Protocol):
    """Receives the steps of every provider call, on the event loop.

    Methods must return quickly and never raise: they run inside the retry
    loop, between an attempt and its decision's effect.
    """

    def attempt_started(self, route: str) -> None:
        """An attempt is about to be sent upstream."""

    def attempt_ended(self, route: str, attempt: Attempt) -> None:
        """An attempt is recorded, its decision made (its `wait` set)."""

    def retry_denied(self, route: str) -> None:
        """The route's retry budget refused a retry the rules allowed."""

    def retry_scheduled(self, details: RetryDetails) -> None:
        """A retry will be sent after `details.wait_for` seconds."""

    def call_ended(self, route: str, stop: Stop) -> None:
        """A call ended: answered, refused, or its stream closed."""

    def call_cancelled(self, route: str) -> None:
        """A call was cancelled before it ended (§10.2 row 1)."""


class Unobserved:
    """The observer that ignores everything: the default."""

    def attempt_started(self, route: str) -> None:
        pass

    def attempt_ended(self, route: str, attempt: Attempt) -> None:
        pass

    def retry_denied(self, route: str) -> None:
        pass

    def retry_scheduled(self, details: RetryDetails) -> None:
        pass

    def call_ended(self, route: str, stop: Stop) -> None:
        pass

    def call_cancelled(self, route: str) -> None:
        pass


__all__ = [
    "Attempt",
    "Cause",
    "ProviderObserver",
    "RetryDetails",
    "Stop",
    "Unobserved",
]
