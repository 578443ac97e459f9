"""`effectd ctl daemons` (Admin.ListDaemons) against real daemons on both
stores: the registrations the store keeps, where each stands, and the
STARTED calls whose lease each incarnation granted. On LMDB the one daemon
that holds the data directory; on PostgreSQL every daemon of the database,
whichever daemon answers. PostgreSQL unreachable fails the test, never skips
it (the `pg_url` fixture)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from effectd_client import Client
from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import running_daemon

pytestmark = pytest.mark.slow

Listing = dict[str, Any]


@pytest.fixture
def daemons(capsys: pytest.CaptureFixture[str]) -> Callable[[str], Listing]:
    """`effectd ctl --target TARGET --json daemons`, parsed."""

    def run(target: str) -> Listing:
        capsys.readouterr()
        assert main(["ctl", "--target", target, "--json", "daemons"]) == 0
        listing: Listing = json.loads(capsys.readouterr().out)
        return listing

    return run


def _start(target: str, run_id: str, *call_ids: str) -> None:
    with Client(target) as client:
        for call_id in call_ids:
            answer = client.prepare_tool(
                run_id, call_id, "send_email", {"to": call_id}, start=True
            )
            assert answer.attempt_held


@pytest.mark.parametrize("store_kind", ["lmdb", "postgres"])
def test_one_daemon_lists_itself_with_the_calls_it_started(
    config: ServeConfig,
    clock: ManualClock,
    daemons: Callable[[str], Listing],
    store_kind: str,
) -> None:
    """A fresh store of either kind: one live registration, this daemon's,
    holding the two calls it started; the store is shared only on PostgreSQL."""
    cfg = dataclasses.replace(config, daemon_id="pod-a")
    with running_daemon(cfg, clock) as running:
        _start(running.target, "run-1", "c1", "c2")
        listing = daemons(running.target)
    (me,) = listing["daemons"]
    assert me["daemon_id"] == "pod-a"
    assert me["standing"] == "LIVE"
    assert me["started_calls"] == 2
    assert me["answering"] is True
    assert me["incarnation"] == listing["incarnation"]
    assert listing["shared"] is (store_kind == "postgres")
    assert me["ended_at"] is None


def test_a_restart_on_lmdb_shows_the_superseded_incarnation(
    config: ServeConfig, clock: ManualClock, daemons: Callable[[str], Listing]
) -> None:
    """The next start under the same id supersedes the earlier registration,
    whose started call the restart settled: it holds none any more."""
    cfg = dataclasses.replace(config, daemon_id="pod-a")
    with running_daemon(cfg, clock) as running:
        _start(running.target, "run-1", "c1")
    with running_daemon(cfg, clock) as running:
        earlier, now = daemons(running.target)["daemons"]
    assert earlier["standing"] == "SUPERSEDED"
    assert earlier["superseded_by"] == now["incarnation"]
    assert earlier["started_calls"] == 0
    assert now["answering"] is True


@pytest.mark.parametrize("store_kind", ["postgres"])
def test_every_daemon_of_one_database_is_listed_by_any_of_them(
    config: ServeConfig,
    clock: ManualClock,
    daemons: Callable[[str], Listing],
    store_kind: str,
) -> None:
    """Two daemons on one database: each lists both, with the calls each
    started; after B's clean stop, A lists B as ended, still holding its
    call (settled at its next touch or the next lease sweep)."""
    a_cfg = dataclasses.replace(config, daemon_id="pod-a")
    b_cfg = dataclasses.replace(
        config,
        daemon_id="pod-b",
        data_dir=config.data_dir.with_name("data-b"),
    )
    with running_daemon(a_cfg, clock) as a:
        with running_daemon(b_cfg, clock) as b:
            _start(a.target, "run-a", "c1")
            _start(b.target, "run-b", "c1", "c2")
            from_a = daemons(a.target)
            from_b = daemons(b.target)
        after = daemons(a.target)

    def by_id(listing: Listing) -> dict[str, Any]:
        return {d["daemon_id"]: d for d in listing["daemons"]}

    for listing, answering in ((from_a, "pod-a"), (from_b, "pod-b")):
        seen = by_id(listing)
        assert set(seen) == {"pod-a", "pod-b"}
        assert {d: seen[d]["standing"] for d in seen} == {
            "pod-a": "LIVE",
            "pod-b": "LIVE",
        }
        assert (seen["pod-a"]["started_calls"], seen["pod-b"]["started_calls"]) == (
            1,
            2,
        )
        assert [d for d in seen if seen[d]["answering"]] == [answering]
        assert listing["shared"] is True
    ended = by_id(after)["pod-b"]
    assert ended["standing"] == "ENDED"
    assert ended["ended_at"] is not None
    assert ended["started_calls"] == 2


@pytest.mark.parametrize("store_kind", ["postgres"])
def test_the_table_names_each_daemon_and_marks_the_one_answering(
    config: ServeConfig,
    clock: ManualClock,
    capsys: pytest.CaptureFixture[str],
    store_kind: str,
) -> None:
    cfg = dataclasses.replace(config, daemon_id="pod-a")
    with running_daemon(cfg, clock) as running:
        _start(running.target, "run-1", "c1")
        capsys.readouterr()
        assert main(["ctl", "--target", running.target, "daemons"]) == 0
        out = capsys.readouterr().out
    header, row, *_ = out.splitlines()
    assert header.split()[:3] == ["DAEMON", "INCARNATION", "STANDING"]
    assert row.split()[0:2] == ["*", "pod-a"]
    assert row.split()[3] == "live"
    assert row.split()[-1] == "1"
    assert "the store is shared by several daemons" in out
