"""`effectd ctl restore`: a restored store never answers EXECUTE for a call
that was open in the backup, is recognisable afterwards, and is audited; the
unsafe variants are refused; a restore stopped at any step leaves nothing a
daemon answers from unmarked. The negative controls: a plain file copy of the
backup, and a restore that copies into place before it marks."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import lmdb
import pytest
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import (
    admin_pb2_grpc,
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    ledger_pb2_grpc,
    recovery_pb2_grpc,
)
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ConfigError, ServeConfig
from sidecar.ctl import restore as ctl_restore
from sidecar.storage import marking
from sidecar.storage.lmdb import restore as restoring
from sidecar.testing import running_daemon
from tests.conftest import NO_SWEEP_SECONDS
from tests.rpc.support import assert_serving, prepare_request, ref

Ledger = ledger_pb2_grpc.ToolLedgerStub
# Open in the backup, finished after it: what a restore must not answer
# EXECUTE for.
OPEN_AT_BACKUP = ("late", "gated", "running")
RESULT = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json='{"ok":1}'))


class Crash(BaseException):
    """The restore process dies at this step (no handler sees it)."""


def _config(data_dir: Path) -> ServeConfig:
    return ServeConfig(data_dir=data_dir, settle_interval_seconds=NO_SWEEP_SECONDS)


@contextmanager
def _serving(data_dir: Path, clock: ManualClock) -> Iterator[grpc.Channel]:
    with (
        running_daemon(_config(data_dir), clock) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        yield channel


def _commit(ledger: Ledger, call_id: str, attempt: int) -> None:
    ledger.CommitTool(
        pb.CommitToolRequest(ref=ref("run", call_id), attempt=attempt, result=RESULT),
        timeout=5,
    )


def _start(
    ledger: Ledger, call_id: str, *, require_approval: bool = False
) -> pb.PrepareToolResponse:
    return ledger.PrepareTool(
        prepare_request("run", call_id, start=True, require_approval=require_approval),
        timeout=5,
    )


@pytest.fixture(autouse=True)
def restore_on_the_manual_clock(
    monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    """`ctl restore` reads the same clock as the daemons of the test."""
    monkeypatch.setattr(ctl_restore, "SystemClock", lambda: clock)


@pytest.fixture
def backup(short_tmp: Path, clock: ManualClock) -> Path:
    """A backup taken while `late` was PREPARED, `gated` awaited approval and
    `running` was STARTED; all three were committed after it."""
    path = short_tmp / "backup"
    with _serving(short_tmp / "live", clock) as channel:
        ledger = Ledger(channel)
        ledger.PrepareTool(prepare_request("run", "late"), timeout=5)
        gated = ledger.PrepareTool(
            prepare_request("run", "gated", require_approval=True), timeout=5
        ).call
        done = _start(ledger, "done")
        _commit(ledger, "done", done.call.attempt)
        running = _start(ledger, "running")
        checkpoints = checkpoints_pb2_grpc.CheckpointsStub(channel)
        checkpoints.Put(
            checkpoints_pb2.PutCheckpointRequest(
                key="k", value=b"1", expect_absent=True
            ),
            timeout=5,
        )
        admin_pb2_grpc.AdminStub(channel).Backup(
            apb.BackupRequest(path=str(path)), timeout=30
        )
        # After the backup: everything open finishes.
        late = _start(ledger, "late")
        assert late.attempt_held
        _commit(ledger, "late", late.call.attempt)
        ledger.DecideApproval(
            pb.DecideApprovalRequest(
                ref=ref("run", "gated"),
                approve=True,
                approver="ada",
                reason="fine",
                expected_revision=gated.revision,
                input_fingerprint=gated.input_fingerprint,
            ),
            timeout=5,
        )
        gated_start = _start(ledger, "gated", require_approval=True)
        _commit(ledger, "gated", gated_start.call.attempt)
        _commit(ledger, "running", running.call.attempt)
    return path


def _restore(backup: Path, data_dir: Path, *, as_json: bool = False) -> int:
    return main(
        [
            "ctl",
            *(["--json"] if as_json else []),
            "restore",
            str(backup),
            "--data-dir",
            str(data_dir),
            "--reason",
            "the disk died",
            "--operator",
            "olga",
        ]
    )


def _decisions(ledger: Ledger) -> dict[str, pb.Decision.ValueType]:
    """What an agent resuming the run is told for each call (prepare with
    start: the decision, and whether it holds the attempt)."""
    found = {}
    for call_id in (*OPEN_AT_BACKUP, "done"):
        answer = _start(ledger, call_id, require_approval=call_id == "gated")
        found[call_id] = answer.decision
        assert answer.attempt_held is (answer.decision == pb.DECISION_EXECUTE)
    return found


def execute_violations(data_dir: Path, clock: ManualClock) -> list[str]:
    """Calls open at the backup that a daemon on `data_dir` answers EXECUTE
    (it would run them again); a daemon that refuses to start answers none."""
    try:
        with _serving(data_dir, clock) as channel:
            decisions = _decisions(Ledger(channel))
    except ConfigError:
        return []
    return [c for c in OPEN_AT_BACKUP if decisions[c] == pb.DECISION_EXECUTE]


def test_after_a_restore_calls_open_at_the_backup_answer_reconcile(
    backup: Path,
    short_tmp: Path,
    clock: ManualClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A call prepared before the backup and run after it answers RECONCILE,
    never EXECUTE, on the restored store, and so do the approved and the
    STARTED one; the committed one replays its result; the backup is left as
    it was (issue 10 item 18: fails before the fix: a restored copy answered
    EXECUTE)."""
    restored = short_tmp / "restored"
    capsys.readouterr()
    kept = {p.name: p.read_bytes() for p in backup.iterdir()}
    assert _restore(backup, restored) == 0
    # The restore only reads the backup.
    assert {p.name: p.read_bytes() for p in backup.iterdir()} == kept
    out = capsys.readouterr().out
    assert "made UNKNOWN  3 calls" in out
    assert "calls recorded after the backup was taken" in out
    with _serving(restored, clock) as channel:
        ledger = Ledger(channel)
        assert _decisions(ledger) == {
            "late": pb.DECISION_RECONCILE,
            "gated": pb.DECISION_RECONCILE,
            "running": pb.DECISION_RECONCILE,
            "done": pb.DECISION_RETURN_RESULT,
        }
        late = ledger.GetToolCall(pb.GetToolCallRequest(ref=ref("run", "late"))).call
        assert (late.history[-1].event, late.history[-1].actor) == ("restore", "olga")
        plan = recovery_pb2_grpc.RecoveryStub(channel).Recover(
            rpb.RecoverRequest(run_id="run"), timeout=5
        )
        assert plan.interrupted
        assert all(
            i.action == rpb.RECOVERY_ACTION_RECONCILE
            for i in plan.items
            if i.call.ref.call_id in OPEN_AT_BACKUP
        )


def test_negative_control_a_plain_copy_of_the_backup_answers_execute(
    backup: Path, short_tmp: Path, clock: ManualClock
) -> None:
    """Without the restore step, a daemon on a copy of the backup answers
    EXECUTE for the call that already ran: the check above can fail."""
    plain = short_tmp / "plain"
    shutil.copytree(backup, plain)
    assert execute_violations(plain, clock) == ["late"]
    restored = short_tmp / "restored"
    assert _restore(backup, restored) == 0
    assert execute_violations(restored, clock) == []


def test_a_restored_store_is_recognisable_and_audited(
    backup: Path, short_tmp: Path, clock: ManualClock
) -> None:
    """GetStats names the restore; the audit chain verifies and ends with it;
    a second restore counts; the checkpoint revisions jump past any the lost
    later state may have issued; a call that awaited approval and is found
    never executed waits for its approver again."""
    restored = short_tmp / "restored"
    assert _restore(backup, restored) == 0
    with _serving(restored, clock) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        stats = admin.GetStats(apb.GetStatsRequest(), timeout=5)
        r = stats.restored
        assert (r.backup, r.actor, r.reason) == (str(backup), "olga", "the disk died")
        assert (r.made_unknown, r.restores) == (3, 1)
        assert 0 < r.backup_incarnation < stats.incarnation
        assert admin.VerifyAudit(apb.VerifyAuditRequest(), timeout=5).ok
        [entry] = admin.ListAudit(
            apb.ListAuditRequest(newest_first=True, page_size=1), timeout=5
        ).entries
        assert (entry.action, entry.sequence) == (
            apb.AUDIT_ACTION_RESTORE,
            r.audit_sequence,
        )
        assert entry.details["madeUnknown"] == "3"
        put = checkpoints_pb2_grpc.CheckpointsStub(channel).Put(
            checkpoints_pb2.PutCheckpointRequest(
                key="k2", value=b"2", expect_absent=True
            ),
            timeout=5,
        )
        assert put.revision > 1 << 32
        ledger = Ledger(channel)
        gated = ledger.GetToolCall(pb.GetToolCallRequest(ref=ref("run", "gated"))).call
        # Whoever ran it meanwhile may still be running: the reconcile
        # quarantine counts from the restore.
        clock.advance(3600)
        back = ledger.Reconcile(
            pb.ReconcileRequest(
                ref=ref("run", "gated"),
                expected_revision=gated.revision,
                operator="olga",
                reason="not in the target",
                evidence="searched by key run:gated",
                not_executed=True,
            ),
            timeout=5,
        ).call
        assert back.state == pb.CALL_STATE_AWAITING_APPROVAL
    again = short_tmp / "again"
    assert _restore(restored_backup(restored, clock, short_tmp), again) == 0
    with _serving(again, clock) as channel:
        stats = admin_pb2_grpc.AdminStub(channel).GetStats(apb.GetStatsRequest())
        assert stats.restored.restores == 2


def restored_backup(data_dir: Path, clock: ManualClock, tmp: Path) -> Path:
    """A backup of the store in `data_dir`, taken by its daemon."""
    path = tmp / "backup-of-restored"
    with _serving(data_dir, clock) as channel:
        admin_pb2_grpc.AdminStub(channel).Backup(
            apb.BackupRequest(path=str(path)), timeout=30
        )
    return path


def test_restore_prints_json_for_scripts(
    backup: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert _restore(backup, short_tmp / "restored", as_json=True) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["marker"]["made_unknown"] == 3
    assert done["data_dir"] == str(short_tmp / "restored")


# --- the unsafe variants are refused ----------------------------------------


def _refused(capsys: pytest.CaptureFixture[str], backup: Path, data_dir: Path) -> str:
    capsys.readouterr()
    assert _restore(backup, data_dir) == 1
    return capsys.readouterr().err


def test_restoring_into_the_data_directory_of_a_running_daemon_is_refused(
    backup: Path,
    short_tmp: Path,
    clock: ManualClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The daemon's lock refuses it; the daemon serves on, its store as it was."""
    live = short_tmp / "live"
    with _serving(live, clock) as channel:
        err = _refused(capsys, backup, live)
        assert "stop that daemon first" in err
        assert_serving(channel)
        call = (
            Ledger(channel)
            .GetToolCall(pb.GetToolCallRequest(ref=ref("run", "late")), timeout=5)
            .call
        )
        assert call.state == pb.CALL_STATE_COMMITTED


def _holding_a_store(target: Path) -> None:
    target.mkdir()
    (target / "data.mdb").write_bytes(b"")


def _writable_by_others(target: Path) -> None:
    target.mkdir()
    os.chmod(target, 0o770)  # noqa: S103 (the unsafe mode under test)


def _a_file(target: Path) -> None:
    target.write_text("x")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (_holding_a_store, "already holds a store"),
        (_writable_by_others, "group- or world-writable"),
        (_a_file, "not a directory"),
    ],
    ids=["a store there", "writable by others", "a file"],
)
def test_an_unsafe_data_directory_is_refused(
    backup: Path,
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], None],
    why: str,
) -> None:
    """Nothing is written into a directory that holds a store, that others
    may write to, or that is no directory."""
    target = short_tmp / "target"
    make(target)
    assert why in _refused(capsys, backup, target)
    assert not (target / restoring.STAGING).exists()


def test_a_backup_that_is_no_store_or_is_served_is_refused(
    backup: Path,
    short_tmp: Path,
    clock: ManualClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not a backup, the data directory of a running daemon, the backup itself
    or a directory inside it as the target: refused, the backup untouched."""
    empty = short_tmp / "empty"
    empty.mkdir()
    assert "not a backup" in _refused(capsys, empty, short_tmp / "t1")
    with _serving(short_tmp / "live", clock):
        err = _refused(capsys, short_tmp / "live", short_tmp / "t2")
        assert "running daemon" in err
    before = sorted(p.name for p in backup.iterdir())
    assert "inside) the backup" in _refused(capsys, backup, backup)
    assert "inside) the backup" in _refused(capsys, backup, backup / "sub")
    assert sorted(p.name for p in backup.iterdir()) == before


def test_a_backup_of_a_newer_format_is_refused(
    backup: Path, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newer = short_tmp / "newer"
    shutil.copytree(backup, newer)
    env = lmdb.open(str(newer), max_dbs=16)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"format_version", b"99", db=meta)
    env.close()
    target = short_tmp / "target"
    assert "store format 99" in _refused(capsys, newer, target)
    assert not (target / "data.mdb").exists()


# --- a restore stopped at any step ------------------------------------------

STEPS = ["_copy", "_mark_batch", "_finish", "_install", "_discard"]
# Steps the store's writer thread runs: a failure there is an error of the
# write (the writer survives it), not a crash of the process.
IN_THE_WRITER = ("_mark_batch", "_finish")


def _stop_at(monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    # The marking's steps are the backend-neutral marking's.
    module = marking if step in IN_THE_WRITER else restoring
    real = getattr(module, step)

    def stopped(*args: object, **kw: object) -> object:
        if step in IN_THE_WRITER:
            raise OSError(f"the disk failed in {step}")
        if step in ("_install", "_discard"):
            real(*args, **kw)  # the step itself is done, the next one is not
        raise Crash(step)

    monkeypatch.setattr(module, step, stopped)


@pytest.mark.parametrize("step", STEPS)
def test_a_restore_stopped_at_any_step_never_answers_from_unmarked_data(
    backup: Path,
    short_tmp: Path,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    """Stopped at `step` (a crash, or a failed write refused with exit 1), the
    data directory has either no store (a daemon refuses to start: the
    restore did not finish) or the marked one; running the restore again
    then finishes it."""
    target = short_tmp / "target"
    with monkeypatch.context() as m:
        _stop_at(m, step)
        if step in IN_THE_WRITER:
            assert _restore(backup, target) == 1
        else:
            with pytest.raises(Crash):
                _restore(backup, target)
    assert execute_violations(target, clock) == []
    if not (target / "data.mdb").exists():
        with (
            pytest.raises(ConfigError, match="did not finish"),
            running_daemon(_config(target), clock),
        ):
            pass
        assert _restore(backup, target) == 0
    assert execute_violations(target, clock) == []


def _copy_then_mark(backup: Path, data_dir: Path) -> None:
    """Broken on purpose: the backup is put in place first, to be marked
    there afterwards; this one stops in between."""
    shutil.copytree(backup, data_dir)
    raise Crash("before marking")


def test_negative_control_copying_into_place_before_marking_is_caught(
    backup: Path, short_tmp: Path, clock: ManualClock
) -> None:
    target = short_tmp / "target"
    with pytest.raises(Crash):
        _copy_then_mark(backup, target)
    assert execute_violations(target, clock) == ["late"]


def test_an_unfinished_restore_is_named_by_the_daemon(short_tmp: Path) -> None:
    """Only staging and no store: the daemon's start says what to do."""
    target = short_tmp / "target"
    (target / restoring.STAGING).mkdir(parents=True)
    with pytest.raises(marking.UnfinishedRestore, match="ctl restore"):
        restoring.refuse_unfinished(target)
    (target / "data.mdb").write_bytes(b"")
    restoring.refuse_unfinished(target)
