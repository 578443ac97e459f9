"""The manual clock's sleep: it wakes when the test moves the clock, from any
thread, and never on real time."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sidecar.clock import ManualClock, SystemClock


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
