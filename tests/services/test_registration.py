"""A serving daemon's registration (`services.membership`) on its LMDB store:
registered at start under its daemon id, renewed by its own periodic task
on the injected clock, ended at a clean stop, superseded by the next start;
and its passes claimed under their locks, which an exclusive store's next
daemon takes over."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.ownership import Registration
from sidecar.services.membership import LEASE_SWEEP, RETENTION
from sidecar.storage import daemons
from sidecar.testing import RunningDaemon, running_daemon
from tests.support import postgres

TTL = 3.0


def _registrations(running: RunningDaemon) -> list[Registration]:
    services = running.daemon.services
    assert services is not None
    read = services.membership.registrations()
    return asyncio.run_coroutine_threadsafe(read, running.loop).result(30)


def _stored(config: ServeConfig) -> tuple[list[Registration], list[str]]:
    store = postgres.store_of(config)
    try:
        regs = store.read(lambda view: list(daemons.every(view)))
        locks = store.read(
            lambda view: [
                name
                for name in (LEASE_SWEEP, RETENTION)
                if daemons.load_lock(view, name) is not None
            ]
        )
        return regs, locks
    finally:
        store.close()


def test_a_daemon_registers_renews_and_ends_its_registration(
    config: ServeConfig, clock: ManualClock
) -> None:
    cfg = dataclasses.replace(config, registration_ttl_seconds=TTL)
    with running_daemon(cfg, clock) as running:
        services = running.daemon.services
        assert services is not None
        [first] = _registrations(running)
        assert first.daemon_id == (
            f"{socket.gethostname()}:{cfg.socket_path.resolve()}"
        )
        assert first.incarnation == services.store.incarnation
        assert first.expires_ns == clock.wall_ns() + int(TTL * 1e9)
        running.wait_for_periodic_tasks()
        clock.advance(TTL / 3)
        running.wait_for_periodic_tasks()
        [renewed] = _registrations(running)
        assert renewed.expires_ns == clock.wall_ns() + int(TTL * 1e9)
    [ended], _ = _stored(cfg)
    assert ended.ended_ns == clock.wall_ns()
    assert not ended.live(clock.wall_ns())


def test_the_next_start_supersedes_the_earlier_registration(
    config: ServeConfig, clock: ManualClock
) -> None:
    named = dataclasses.replace(config, daemon_id="agent-7")
    with running_daemon(named, clock):
        pass
    with running_daemon(named, clock) as running:
        services = running.daemon.services
        assert services is not None
        earlier, now = _registrations(running)
        assert earlier.superseded_by == now.incarnation
        assert now.daemon_id == "agent-7"
        assert now.live(clock.wall_ns())


def test_a_start_runs_the_compaction_pass_under_its_lock(
    config: ServeConfig, clock: ManualClock
) -> None:
    """The start-time compaction claimed its lock; the next daemon of an
    exclusive store runs its passes though the lock's holder never let go."""
    with running_daemon(config, clock):
        pass
    _, locks = _stored(config)
    assert locks == ["retention"]
    with running_daemon(config, clock) as running:
        services = running.daemon.services
        assert services is not None
        claimed = asyncio.run_coroutine_threadsafe(
            services.membership.claim(LEASE_SWEEP, 1e9), running.loop
        ).result(timeout=10)
        assert claimed
        done = asyncio.run_coroutine_threadsafe(
            running.daemon.compact_expired(), running.loop
        ).result(timeout=10)
        assert done is not None
