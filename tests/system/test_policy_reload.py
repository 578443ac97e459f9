"""SIGHUP reloads the policy file of `effectd serve --policy` (ADR-010 R2,
contract §10.6), in a daemon running as its own process: the new policy decides
the next call, the reload is audited as "sighup", a malformed file leaves the
old policy in force and the daemon serving."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import admin_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb

from tests.rpc.support import assert_serving, prepare_request, ref
from tests.support.processes import DaemonProcess, daemon_process

pytestmark = pytest.mark.slow

TOOL = "search"
FORCED = f'[tools.{TOOL}]\neffect = "side-effect"\n'


@pytest.fixture
def policy_path(short_tmp: Path) -> Path:
    path = short_tmp / "policy.toml"
    path.write_text("")
    return path


@pytest.fixture
def proc(short_tmp: Path, policy_path: Path) -> Iterator[DaemonProcess]:
    with daemon_process(short_tmp / "data", args=["--policy", str(policy_path)]) as d:
        yield d


def _reloaded(proc: DaemonProcess) -> None:
    """Waits for the daemon's log line of a reload done."""
    assert proc.wait_for_line(lambda line: "policy reloaded" in line), proc.log()


def _unknown_read(ledger: ledger_pb2_grpc.ToolLedgerStub, call_id: str) -> None:
    answer = ledger.PrepareTool(
        prepare_request(
            "run", call_id, tool_name=TOOL, effect=pb.EFFECT_READ, start=True
        ),
        timeout=5,
    )
    ledger.ReportUnknown(
        pb.ReportUnknownRequest(
            ref=ref("run", call_id), attempt=answer.call.attempt, reason="timeout"
        ),
        timeout=5,
    )


def _decision(ledger: ledger_pb2_grpc.ToolLedgerStub, call_id: str) -> int:
    again = prepare_request("run", call_id, tool_name=TOOL, effect=pb.EFFECT_READ)
    return ledger.PrepareTool(again, timeout=5).decision


def _audit(channel: grpc.Channel) -> list[apb.AuditEntry]:
    stub = admin_pb2_grpc.AdminStub(channel)
    return list(stub.ListAudit(apb.ListAuditRequest(), timeout=5).entries)


def test_sighup_reloads_the_policy(proc: DaemonProcess, policy_path: Path) -> None:
    """After SIGHUP the forced SIDE_EFFECT decides the next call (RECONCILE
    instead of EXECUTE), and the audit log has the reload by "sighup"."""
    with grpc.insecure_channel(proc.target) as channel:
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        _unknown_read(ledger, "call")
        assert _decision(ledger, "call") == pb.DECISION_EXECUTE

        policy_path.write_text(FORCED)
        os.kill(proc.proc.pid, signal.SIGHUP)
        _reloaded(proc)
        assert _decision(ledger, "call") == pb.DECISION_RECONCILE
        [entry] = _audit(channel)
        assert entry.action == apb.AUDIT_ACTION_POLICY_RELOAD
        assert entry.actor == "sighup"
        assert entry.details["changed"] == "tools.search.effect"
        assert proc.proc.poll() is None


def test_sighup_with_a_malformed_file_keeps_the_old_policy(
    proc: DaemonProcess, policy_path: Path
) -> None:
    """A malformed file on SIGHUP is refused in the log, naming the setting;
    the old policy decides and the daemon keeps serving."""
    with grpc.insecure_channel(proc.target) as channel:
        ledger = ledger_pb2_grpc.ToolLedgerStub(channel)
        policy_path.write_text(FORCED)
        os.kill(proc.proc.pid, signal.SIGHUP)
        _reloaded(proc)
        assert len(_audit(channel)) == 1

        policy_path.write_text("[retry]\nmax_attempts = 0\n")
        os.kill(proc.proc.pid, signal.SIGHUP)
        assert proc.wait_for_line(lambda line: "policy reload refused" in line)
        assert "retry.max_attempts" in proc.log()
        _unknown_read(ledger, "call")
        assert _decision(ledger, "call") == pb.DECISION_RECONCILE
        assert len(_audit(channel)) == 1
        assert_serving(channel)


def test_sighup_without_a_policy_file_keeps_serving(short_tmp: Path) -> None:
    """SIGHUP to a daemon without --policy is logged as refused, never fatal."""
    with daemon_process(short_tmp / "data") as proc:
        os.kill(proc.proc.pid, signal.SIGHUP)
        assert proc.wait_for_line(lambda line: "NO_POLICY_FILE" in line), proc.log()
        with grpc.insecure_channel(proc.target) as channel:
            assert_serving(channel)
        assert proc.terminate() == 0
