"""Time as a seam: wall time for records people read, monotonic time for leases,
and waiting on that same time for the daemon's periodic work (`every`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol


class Clock(Protocol):
    def wall_ns(self) -> int:
        """Nanoseconds since the Unix epoch (for history and display)."""
        ...

    def monotonic_ns(self) -> int:
        """Nanoseconds of a clock that never goes back (for leases)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Returns once `seconds` of this clock's monotonic time have passed."""
        ...


def monotonic_seconds(clock: Clock) -> Callable[[], float]:
    """`clock`'s monotonic time in seconds, as `time.monotonic` gives it."""
    return lambda: clock.monotonic_ns() / 1e9


async def every(
    clock: Clock, seconds: float, run: Callable[[], Awaitable[object]]
) -> None:
    """Runs `run` each time `seconds` of `clock` have passed, until cancelled.

    The wait starts after the previous run ends, so runs never overlap; a
    clock that jumps past several intervals at once wakes one run, not a
    burst of them.
    """
    while True:
        await clock.sleep(seconds)
        await run()


class SystemClock:
    def wall_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; for tests.

    `sleep` returns when `advance` (from any thread) moves the clock past its
    deadline; `wait_for_sleepers` lets a test see that a periodic task went
    round and waits on the clock again.
    """

    def __init__(
        self, wall_ns: int = 1_700_000_000_000_000_000, monotonic_ns: int = 0
    ) -> None:
        self._wall = wall_ns
        self._mono = monotonic_ns
        self._changed = threading.Condition()
        # (deadline on the monotonic clock, the sleeper's loop and future)
        self._sleepers: list[
            tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]
        ] = []

    def wall_ns(self) -> int:
        return self._wall

    def monotonic_ns(self) -> int:
        return self._mono

    def advance(self, seconds: float) -> None:
        step = int(seconds * 1e9)
        with self._changed:
            self._wall += step
            self._mono += step
            due = [s for s in self._sleepers if s[0] <= self._mono]
            self._sleepers = [s for s in self._sleepers if s[0] > self._mono]
            self._changed.notify_all()
        for _, loop, future in due:
            loop.call_soon_threadsafe(_wake, future)

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._changed:
            entry = (self._mono + int(seconds * 1e9), loop, future)
            if entry[0] <= self._mono:
                return
            self._sleepers.append(entry)
            self._changed.notify_all()
        try:
            await future
        finally:
            with self._changed:
                if entry in self._sleepers:
                    self._sleepers.remove(entry)

    def wait_for_sleepers(self, count: int = 1, timeout: float = 10.0) -> None:
        """Blocks until `count` tasks sleep on this clock.

        Raises:
            TimeoutError: fewer did within `timeout` seconds of real time.
        """
        with self._changed:
            if not self._changed.wait_for(
                lambda: len(self._sleepers) >= count, timeout
            ):
                raise TimeoutError(
                    f"{len(self._sleepers)} tasks sleep on the clock, not {count}"
                )


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
