"""Outcomes handed from a store's threads to the event loop that awaits
them, without `run_in_executor`'s or `asyncio.wrap_future`'s two futures:
the thread calls `hand_back`, which delivers on the loop
(`call_soon_threadsafe`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


def _deliver(
    future: asyncio.Future[Any], value: Any, error: BaseException | None
) -> None:
    """On the loop: `future`'s outcome, `value` or `error`, unless its waiter
    cancelled it."""
    if future.cancelled():
        return
    if error is None:
        future.set_result(value)
    elif isinstance(error, StopIteration):
        # A future cannot hold StopIteration (it would end a coroutine).
        future.set_exception(RuntimeError(f"the work raised {error!r}"))
    else:
        future.set_exception(error)


def hand_back(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    value: Any,
    error: BaseException | None,
) -> None:
    """From a store's thread: `future`'s outcome, delivered on `loop`.
    Nothing when the loop has closed: nobody waits for the answer."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_deliver, future, value, error)
