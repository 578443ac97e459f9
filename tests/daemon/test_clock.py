"""The manual clock's sleep: it wakes when the test moves the clock, from any
thread, and never on real time; the periodic work of `every` runs on it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sidecar.clock import ManualClock, SystemClock, every, monotonic_seconds


def test_a_sleeper_wakes_when_another_thread_advances_past_its_deadline() -> None:
    """Half the time does not wake it; the rest does; it then sleeps no more."""
    clock = ManualClock()
    woke = threading.Event()

    async def sleeper() -> None:
        await clock.sleep(10)
        woke.set()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(sleeper(),))
    thread.start()
    try:
        clock.wait_for_sleepers(1)
        clock.advance(5)
        # Still registered: `advance` removes the sleepers it wakes at once.
        clock.wait_for_sleepers(1, timeout=0)
        clock.advance(5)
        assert woke.wait(10)
    finally:
        thread.join(10)
        loop.close()
    with pytest.raises(TimeoutError):
        clock.wait_for_sleepers(1, timeout=0.01)


def test_a_cancelled_sleeper_leaves_and_a_zero_sleep_returns_at_once() -> None:
    clock = ManualClock()

    async def scenario() -> None:
        await clock.sleep(0)
        task = asyncio.create_task(clock.sleep(1))
        await asyncio.sleep(0)
        clock.wait_for_sleepers(1, timeout=1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await SystemClock().sleep(0)

    asyncio.run(scenario())
    with pytest.raises(TimeoutError):
        clock.wait_for_sleepers(1, timeout=0.01)


def test_every_runs_once_per_interval_the_clock_moves() -> None:
    """After N advances of one interval the task has run N times; an advance
    short of the interval runs nothing (the control), and a jump over several
    intervals runs it once, not once per interval missed."""
    clock = ManualClock()
    runs: list[float] = []
    seconds = monotonic_seconds(clock)

    async def run() -> None:
        runs.append(seconds())

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    task = asyncio.run_coroutine_threadsafe(every(clock, 10, run), loop)
    try:
        clock.wait_for_sleepers(1)
        for n in range(1, 4):
            clock.advance(10)
            # Asleep again: the run this advance woke is done.
            clock.wait_for_sleepers(1)
            assert len(runs) == n
        clock.advance(9.5)
        clock.wait_for_sleepers(1, timeout=0)
        assert runs == [10.0, 20.0, 30.0]
        clock.advance(0.5)
        clock.wait_for_sleepers(1)
        clock.advance(35)
        clock.wait_for_sleepers(1)
        assert runs == [10.0, 20.0, 30.0, 40.0, 75.0]
    finally:
        task.cancel()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
