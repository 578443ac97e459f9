"""A write on the PostgreSQL store cancelled while it waits (a request's
deadline passing) is never answered while it may still commit: cancelled
before its transaction began, it never runs; cancelled while its
transaction runs, the cancellation waits for the commit, so whatever the
request is answered comes after its write is durable or undone.

The writer is held by the test (a write function that waits for an event),
so the order of events is the test's, never a timing's. The negative
control awaits the queued write's outcome without that wait: its
cancellation returns while the transaction still runs, and the test
catches the write committing after the answer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from sidecar.storage.api import Table, WriteView
from sidecar.storage.postgres import store as pg_store
from sidecar.storage.postgres.options import PostgresOptions
from sidecar.storage.postgres.store import PostgresStore

# A bound on every wait; reached only when the code under test is broken.
WAIT = 30.0


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(pg_url, PostgresOptions(writers=1))
    yield opened
    opened.close()


class Held:
    """A write function that puts one META key, once the test lets it."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.running = threading.Event()
        self.go = threading.Event()
        self.ran = False

    def __call__(self, view: WriteView) -> None:
        self.ran = True
        self.running.set()
        assert self.go.wait(WAIT), "the test never let the write go on"
        view.put(Table.META, self.key, b"written")


def _stored(store: PostgresStore, key: bytes) -> bytes | None:
    return store.read(lambda view: view.get(Table.META, key))


def _cancelled_while_running(store: PostgresStore) -> tuple[bool, bytes | None]:
    """Whether the cancelled write's awaiting ended before the test let its
    transaction go on; what its key holds once it ended (the control's
    write may still be committing then)."""
    held = Held(b"held")

    async def run() -> bool:
        task = asyncio.ensure_future(store.write(held))
        running = await asyncio.to_thread(held.running.wait, WAIT)
        assert running, "the write never ran"
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=0.5)
        ended_early = bool(done)
        held.go.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)
        return ended_early

    early = asyncio.run(run())
    return early, _stored(store, held.key)


def test_a_write_cancelled_while_it_runs_ends_after_its_commit(
    store: PostgresStore,
) -> None:
    early, stored = _cancelled_while_running(store)
    assert not early, "the cancelled request ended while its write ran"
    assert stored == b"written"


def test_a_write_cancelled_before_it_runs_never_runs(store: PostgresStore) -> None:
    first, second = Held(b"first"), Held(b"second")

    async def run() -> None:
        holding = asyncio.ensure_future(store.write(first))
        assert await asyncio.to_thread(first.running.wait, WAIT)
        queued = asyncio.ensure_future(store.write(second))
        await asyncio.sleep(0)  # queued behind the held write
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(queued, WAIT)
        first.go.set()
        await asyncio.wait_for(holding, WAIT)

    asyncio.run(run())
    assert not second.ran
    assert _stored(store, b"second") is None
    assert _stored(store, b"first") == b"written"


def test_awaiting_a_queued_write_as_before_is_caught(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: the cancellation returns at once, while the write
    it cancelled still runs, and commits after."""

    def as_before(handoff: pg_store._Handoff[Any]) -> Coroutine[Any, Any, Any]:
        async def awaited() -> Any:
            return await handoff.future

        return awaited()

    awaiting: Callable[[pg_store._Handoff[Any]], Coroutine[Any, Any, Any]] = as_before
    monkeypatch.setattr(pg_store, "_awaited", awaiting)
    early, _ = _cancelled_while_running(store)
    assert early
