"""`effectd ctl restore BACKUP --store URL` (`storage.postgres.restore`): a
PostgreSQL database restored by its own tools is marked as an LMDB restore
marks its copy. Stands in for `pg_restore`: the state the daemons left is
the state restored. The negative control is the same database unmarked,
where a call PREPARED before (which may have run since) answers EXECUTE.
PostgreSQL unreachable fails the test, never skips it (`pg_url`)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc

from effectd_client import Client, Decision, State
from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger import ownership
from sidecar.ledger.restore import CHECKPOINT_REVISION_GAP
from sidecar.services.membership import MembershipService
from sidecar.storage import daemons
from sidecar.storage import marking as restore
from sidecar.storage.api import ReadView, WriteView
from sidecar.storage.postgres import restore as pg_restore
from sidecar.storage.postgres.store import PostgresStore
from sidecar.storage.postgres.views import REGISTRATIONS_LOCK
from sidecar.testing import running_daemon

RUN = "run-1"


@pytest.fixture
def store_kind() -> str:
    return "postgres"


@contextmanager
def _client(config: ServeConfig, clock: ManualClock) -> Iterator[Client]:
    with running_daemon(config, clock) as running, Client(running.target) as client:
        yield client


def _seed(client: Client) -> int:
    """One call in each state, and a checkpoint; answers its revision."""
    client.prepare_tool(RUN, "prepared", "pay", {"n": 1})
    client.prepare_tool(RUN, "awaiting", "pay", {"n": 2}, require_approval=True)
    client.prepare_tool(RUN, "started", "pay", {"n": 3}, start=True)
    done = client.prepare_tool(RUN, "committed", "pay", {"n": 4}, start=True)
    client.commit_tool(RUN, "committed", done.call.attempt, {"ok": True})
    return client.put_checkpoint("cursor", b"1")


def _restore(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["ctl", "restore", "ledger.dump", "--store", url, "--reason", "drill"])
    out, err = capsys.readouterr()
    return code, out + err


def test_a_restored_database_answers_no_open_call_execute(
    config: ServeConfig,
    clock: ManualClock,
    pg_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every call that was not COMMITTED is UNKNOWN after the marking (a side
    effect answers RECONCILE), the committed one is as it was, checkpoint
    revisions jump past any issued since, and stats and the audit log say
    who restored what."""
    with _client(config, clock) as client:
        revision = _seed(client)
    with _client(config, clock) as client:
        # The negative control: unmarked, the PREPARED call (which may have
        # started and run after the dump) is answered EXECUTE.
        again = client.prepare_tool(RUN, "prepared", "pay", {"n": 1})
        assert again.decision is Decision.EXECUTE
    code, out = _restore(pg_url, capsys)
    assert code == 0, out
    assert "made UNKNOWN" in out
    with running_daemon(config, clock) as running, Client(running.target) as client:
        for n, call_id in enumerate(("prepared", "awaiting", "started"), 1):
            assert client.get_tool_call(RUN, call_id).state is State.UNKNOWN
            answer = client.prepare_tool(RUN, call_id, "pay", {"n": n}, start=True)
            assert answer.decision is Decision.RECONCILE, call_id
        assert client.get_tool_call(RUN, "committed").state is State.COMMITTED
        assert client.put_checkpoint("other", b"2") > revision + CHECKPOINT_REVISION_GAP
        with grpc.insecure_channel(running.target) as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            stats = admin.GetStats(admin_pb2.GetStatsRequest())
            assert stats.restored.backup == "ledger.dump"
            # The STARTED call was UNKNOWN already: the negative control's
            # daemon, a restart under the same daemon id, settled it.
            assert stats.restored.made_unknown == 2
            assert admin.VerifyAudit(admin_pb2.VerifyAuditRequest()).ok


def test_the_marking_is_refused_while_a_daemon_serves_the_database(
    config: ServeConfig, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the system clock, as the marking judges registrations by it. The
    refusal says when the registration lapses, and so when to run it again
    (issue 25 item 16: fails before the fix: it said only "at most
    --registration-ttl after the moment restored to")."""
    with running_daemon(config) as running, Client(running.target) as client:
        client.prepare_tool(RUN, "prepared", "pay", {"n": 1})
        before = datetime.now(UTC).replace(microsecond=0)
        code, out = _restore(pg_url, capsys)
        assert code == 1
        assert "daemons are registered live" in out
        assert client.get_tool_call(RUN, "prepared").state is State.PREPARED
    lapses = re.search(r"lapses at (\S+Z) unless renewed, in (\d+) s\)", out)
    again = re.search(r"run the restore again after (\S+Z) \(in (\d+) s\)", out)
    assert lapses, out
    assert again, out
    assert lapses.group(1) == again.group(1)
    at = datetime.fromisoformat(lapses.group(1))
    ttl = timedelta(seconds=config.registration_ttl_seconds)
    assert before <= at <= before + ttl + timedelta(seconds=1)
    assert 0 <= int(lapses.group(2)) <= config.registration_ttl_seconds + 1


def test_the_url_is_printed_masked(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _restore("postgresql://u:hunter2-pw@127.0.0.1:1/nothing", capsys)
    assert code == 1
    assert "hunter2-pw" not in out


def test_a_url_that_is_not_postgresql_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = _restore("mysql://u:hunter2-pw@127.0.0.1/ledger", capsys)
    assert code == 2
    assert "hunter2-pw" not in out


def test_a_marking_stopped_half_way_keeps_daemons_from_starting(
    config: ServeConfig,
    clock: ManualClock,
    pg_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A marking that dies after its first transaction (here: its last one
    fails) leaves calls of the backup unmarked: a daemon refuses to start on
    the database, exit 2 with what to do, until the marking is run again.
    Without the begun record the daemon starts and answers the PREPARED call
    EXECUTE (fails on the code before it)."""
    with _client(config, clock) as client:
        _seed(client)

    def dies(*_: object, **__: object) -> None:
        raise RuntimeError("the marking process died")

    with monkeypatch.context() as patch:
        patch.setattr(restore, "_finish", dies)
        with pytest.raises(RuntimeError, match="died"):
            pg_restore.mark_database(
                pg_url, "ledger.dump", actor="ops", reason="drill", clock=clock
            )
    with (
        pytest.raises(restore.UnfinishedRestore, match=r"ledger\.dump"),
        running_daemon(config, clock),
    ):
        pass
    capsys.readouterr()
    args = ["--store", pg_url, "--data-dir", str(config.data_dir), "--no-reflection"]
    assert main(["serve", *args]) == 2
    assert "effectd ctl restore" in capsys.readouterr().err
    code, out = _restore(pg_url, capsys)
    assert code == 0, out
    with _client(config, clock) as client:
        answer = client.prepare_tool(RUN, "prepared", "pay", {"n": 1}, start=True)
        assert answer.decision is Decision.RECONCILE


def _waiting_on_registrations(url: str) -> bool:
    """Whether a transaction waits for the registrations' lock."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND NOT granted AND objid = (%s::bigint & 4294967295)::oid",
            (REGISTRATIONS_LOCK,),
        ).fetchone()
    return row is not None and int(str(row[0])) > 0


def _check_raced(
    store: PostgresStore,
    raced: list[ownership.Registration | BaseException],
    *,
    refused: bool,
) -> None:
    """The start refused (nothing of it registered), or registered."""
    assert len(raced) == 1
    regs = store.read(lambda v: list(daemons.every(v)))
    if refused:
        assert isinstance(raced[0], restore.UnfinishedRestore), raced
        assert not any(r.daemon_id == "racer" for r in regs)
    else:
        assert isinstance(raced[0], ownership.Registration), raced
        assert any(r.daemon_id == "racer" for r in regs)


@pytest.mark.parametrize("check", ["in-the-marking", "before-it-control"])
def test_a_daemon_starting_during_the_live_check_is_not_missed(
    pg_url: str, clock: ManualClock, check: str
) -> None:
    """A daemon registers while the marking's first transaction is open,
    after its live check read no registration: the check scans the
    registrations, so the marking holds their lock, and the start waits for
    it, then finds the marking begun and refuses to start; the marking goes
    on with no daemon serving. The control checks before the marking (as a
    separate read did): the same interleaving lets the daemon register, and
    the marking goes on under a daemon that serves."""
    marking = PostgresStore(pg_url)
    raced: list[ownership.Registration | BaseException] = []

    def register() -> None:
        racer = PostgresStore(pg_url)
        try:
            members = MembershipService(racer, clock, daemon_id="racer")
            raced.append(asyncio.run(members.register()).registration)
        except restore.UnfinishedRestore as refused:
            raced.append(refused)
        finally:
            racer.close()

    racer = threading.Thread(target=register)

    def race() -> None:
        if racer.is_alive() or raced:
            return
        racer.start()
        if check == "before-it-control":
            racer.join(30)
            return
        # Bounded: the start is seen waiting for the marking's lock.
        for _ in range(300):
            if _waiting_on_registrations(pg_url):
                return
            time.sleep(0.02)
        raise AssertionError("the start never waited for the marking")

    def live(view: ReadView) -> None:
        regs = list(daemons.every(view))
        if any(r.live(clock.wall_ns()) for r in regs):
            raise restore.RestoreRefused("a daemon is registered live")

    def refuse(view: ReadView) -> None:
        if check == "in-the-marking":
            live(view)
        race()

    marked = restore._mark_batch

    def mark_batch(view: WriteView, **kwargs: Any) -> int:
        racer.join(30)  # the start has answered before the marking goes on
        return marked(view, **kwargs)

    try:
        if check == "before-it-control":
            marking.read(live)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(restore, "_mark_batch", mark_batch)
            restore.mark(
                marking, "d", actor="ops", reason="r", clock=clock, refuse=refuse
            )
        assert marking.read(restore.load_marker) is not None
        _check_raced(marking, raced, refused=check == "in-the-marking")
    finally:
        racer.join(30)
        marking.close()
