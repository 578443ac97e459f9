"""Time as a seam: wall time for records people read, monotonic time for leases."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ns(self) -> int:
        """Nanoseconds since the Unix epoch (for history and display)."""
        ...

    def monotonic_ns(self) -> int:
        """Nanoseconds of a clock that never goes back (for leases)."""
        ...


class SystemClock:
    def wall_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


class ManualClock:
    """A clock that moves only when told to; for tests."""

    def __init__(
        self, wall_ns: int = 1_700_000_000_000_000_000, monotonic_ns: int = 0
    ) -> None:
        self._wall = wall_ns
        self._mono = monotonic_ns

    def wall_ns(self) -> int:
        return self._wall

    def monotonic_ns(self) -> int:
        return self._mono

    def advance(self, seconds: float) -> None:
        step = int(seconds * 1e9)
        self._wall += step
        self._mono += step
