"""What every service does the same way: take the moment a rule runs, and
wait for a write function's durable commit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from sidecar.clock import Clock
from sidecar.errors import EffectdError
from sidecar.ledger.rules import Answer, Now
from sidecar.storage.api import ReadView, Store, WriteView
from sidecar.storage.daemons import StoredPeers

T = TypeVar("T")


def moment(clock: Clock, store: Store, view: ReadView) -> Now:
    """Both clocks and the store's incarnation, read together; on a store
    other daemons share, their registrations as `view` holds them, for a
    rule that judges a lease of another incarnation (valid while `view` is)."""
    peers = None if store.exclusive else StoredPeers(view)
    return Now(clock.wall_ns(), clock.monotonic_ns(), store.incarnation, peers)


async def committed(store: Store, fn: Callable[[WriteView], T]) -> T:
    """Runs `fn` in a write transaction (on the event loop, gathered with
    the other writes of its pass: `Store.write`); returns its value once the
    commit is durable. For writes of a few records: the loop serves nothing
    else while they are applied."""
    return await store.write(fn)


async def bulk_committed(store: Store, fn: Callable[[WriteView], T]) -> T:
    """`committed`, for a write of many records (a page of recovery, a
    retention pass or lease sweep): run by the writer thread, so the event
    loop goes on serving while it is applied."""
    return await asyncio.wrap_future(store.submit(fn))


async def answered(
    store: Store, fn: Callable[[WriteView], Answer | EffectdError]
) -> Answer:
    """`committed`, for rules whose refusal may carry a change: the change is
    committed first, then the refusal is raised."""
    reply = await committed(store, fn)
    if isinstance(reply, EffectdError):
        raise reply
    return reply
