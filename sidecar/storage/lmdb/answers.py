"""How the LMDB store answers the requests of a committed batch.

A request queued by `LmdbStore.submit` waits on a `concurrent.futures.Future`
(a thread, or `asyncio.wrap_future`); one queued by `LmdbStore.write` waits
on a future of its event loop (`LoopWaiter`). A batch is answered only after
its commit: on the loop that committed it, at once; from the writer thread,
the loop's futures of a batch by one callback on that loop (`resolve`), one
wake of the loop per batch, where a wrapped concurrent future costs a wake
(and its chaining) per request.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)


class LoopWaiter:
    """A request's future on the event loop that awaits it."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()


Waiter = Future[Any] | LoopWaiter
Outcome = tuple[Waiter, Any, BaseException | None]


def claim(waiter: Waiter) -> bool:
    """Whether the request is still wanted, its waiter then marked running
    (a request cancelled before the writer took it is not applied, as a
    concurrent future that is cancelled before it runs)."""
    if isinstance(waiter, LoopWaiter):
        # Read from the writer thread: the loop may cancel it just after,
        # and its task then ends cancelled while the write is applied, as a
        # wrapped concurrent future that was running.
        return not waiter.future.cancelled()
    return waiter.set_running_or_notify_cancel()


def resolve(outcomes: list[Outcome]) -> None:
    """Answers each request with its value or error: concurrent futures at
    once, each loop's futures in one callback on that loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
    for outcome in outcomes:
        waiter, value, error = outcome
        if isinstance(waiter, LoopWaiter):
            by_loop.setdefault(waiter.loop, []).append(outcome)
        elif error is None:
            waiter.set_result(value)
        else:
            waiter.set_exception(error)
    for loop, answers in by_loop.items():
        if _running() is loop:  # committed on the loop itself
            _resolve_on_loop(answers)
            continue
        try:
            loop.call_soon_threadsafe(_resolve_on_loop, answers)
        except RuntimeError:  # the loop is closed: nobody awaits them
            log.debug("%d answers for a closed event loop dropped", len(answers))


def _running() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _resolve_on_loop(outcomes: list[Outcome]) -> None:
    for waiter, value, error in outcomes:
        assert isinstance(waiter, LoopWaiter)
        future = waiter.future
        if future.done():  # cancelled while it was written
            continue
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
