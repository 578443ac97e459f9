"""What a daemon takes from the world, passed whole at construction.

`Seams` is the frozen set of things a test replaces: the clock (wall time,
monotonic time, and sleeping on that time), the random source of retry
jitter, the provider proxy's HTTP transport and backoff sleep, and the RPC
tracer. Its defaults are production's. Nothing else of a daemon is swapped
after construction: `sidecar.composition` wires the services from the
configuration and these seams, and `sidecar.server` starts and stops them.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import httpx

from sidecar.clock import Clock, SystemClock
from sidecar.failpoints import Failpoints

if TYPE_CHECKING:
    from sidecar.rpc.gate import RpcTracer

    class Tracer(RpcTracer, Protocol):
        """The gate's tracer, closed by the daemon when it stops
        (`sidecar.observability.otel.Tracing`)."""

        def close(self) -> None:
            """Exports the spans still queued."""


def _jitter() -> Callable[[], float]:
    # Spreading retries, not secrecy: a PRNG seeded by the OS is enough.
    return random.Random().random  # noqa: S311


@dataclass(frozen=True, slots=True)
class Seams:
    """A daemon's seams; each default is what production uses.

    Attributes:
        clock: time for leases, records and the retry budget; the periodic
            passes (compaction, the lease sweep) and the rate limiter run on it.
        random: draws in [0, 1) for the jitter of retry backoffs.
        transport: the provider proxy's HTTP transport (an
            `httpx.MockTransport` in tests); None: httpx's own pooled one.
        backoff_sleep: how the provider proxy waits between attempts;
            None: `clock.sleep`.
        tracer: the RPC tracer; None: as the configuration says (`otel`).
            The daemon closes it when it stops.
        failpoints: where the stores crash the process on purpose; only a
            test build sets them (`sidecar.failpoints`).
    """

    clock: Clock = field(default_factory=SystemClock)
    random: Callable[[], float] = field(default_factory=_jitter)
    transport: httpx.AsyncBaseTransport | None = None
    backoff_sleep: Callable[[float], Awaitable[None]] | None = None
    tracer: Tracer | None = None
    failpoints: Failpoints | None = None
