"""Fixtures of the client's session tests over the framed transport, sync
and async: a daemon that holds the prepare of a call whose id starts with
`hold` (`tests.rpc.sessions.HeldDaemon`), and messages that carry no
deadline of their own."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from effectd_client import _session_wire as wire
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.sessions import HeldDaemon, Holds


@pytest.fixture
def holds() -> Holds:
    return Holds()


@pytest.fixture
def held(config: ServeConfig, holds: Holds) -> Iterator[RunningDaemon]:
    cfg = dataclasses.replace(config, grace_seconds=5)
    with running_daemon(cfg, daemon=HeldDaemon(cfg, holds)) as running:
        try:
            yield running
        finally:
            holds.release()


@pytest.fixture
def no_deadline_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The messages carry no deadline of their own (the daemon's default
    one, far off), so that only a cancel cuts a held one here."""
    monkeypatch.setattr(wire, "timeout_ms", lambda timeout: 0)
