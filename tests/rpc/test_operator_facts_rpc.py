"""What a person's face needs from the daemon to decide (issue 25 item 10),
through the real server: when an UNKNOWN call's reconcile quarantine ends,
which is exactly when Reconcile starts accepting "never executed"; and who
the daemon took the caller of a listing for."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import running_daemon
from tests.rpc.support import prepare_request, ref
from tests.support.tokens import ONCALL, TEAM, TEAM_AGENT, tokens_text

LEASE_MS = 2000
# The policy's default: 3 leases of the last attempt.
QUARANTINE_NS = 3 * LEASE_MS * 1_000_000


def _never_executed(revision: int) -> pb.ReconcileRequest:
    return pb.ReconcileRequest(
        ref=ref(),
        expected_revision=revision,
        operator="olga",
        reason="not in the PSP",
        evidence="search by key: nothing",
        not_executed=True,
    )


def test_quarantine_ends_at_is_when_never_executed_is_accepted(
    ledger_stub: ToolLedgerStub, clock: ManualClock
) -> None:
    """An UNKNOWN call says when its quarantine ends: unknown_since plus
    three of its leases; a nanosecond before, "never executed" is refused
    (RECONCILE_QUARANTINE), at it accepted. Other states carry no end."""
    started = ledger_stub.PrepareTool(
        prepare_request(start=True, lease_ms=LEASE_MS), timeout=5
    ).call
    assert not started.HasField("quarantine_ends_at")
    reported = ledger_stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(), attempt=1, reason="lost"), timeout=5
    ).call
    ends = reported.quarantine_ends_at.ToNanoseconds()
    assert ends == reported.unknown_since.ToNanoseconds() + QUARANTINE_NS
    read = ledger_stub.GetToolCall(pb.GetToolCallRequest(ref=ref()), timeout=5).call
    assert read.quarantine_ends_at == reported.quarantine_ends_at
    listed = ledger_stub.ListToolCalls(pb.ListToolCallsRequest(), timeout=5).calls
    assert listed[0].quarantine_ends_at == reported.quarantine_ends_at
    clock.advance((ends - clock.wall_ns() - 1) / 1e9)
    assert clock.wall_ns() == ends - 1
    with pytest.raises(grpc.RpcError) as early:
        ledger_stub.Reconcile(_never_executed(read.revision), timeout=5)
    assert early.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    clock.advance(1e-9)
    done = ledger_stub.Reconcile(_never_executed(read.revision), timeout=5).call
    assert done.state == pb.CALL_STATE_PREPARED
    assert not done.HasField("quarantine_ends_at")


def test_a_listing_names_the_token_and_its_roles(short_tmp: Path) -> None:
    """With tokens, ListToolCalls says whose token it answered and its roles;
    without authentication, nobody."""
    data = short_tmp
    config = ServeConfig(
        data_dir=data / "auth", init=True, tokens_text=tokens_text(*TEAM)
    )
    with running_daemon(config) as daemon:
        for token, name, roles in (
            (ONCALL, "oncall", ["agent", "approver", "operator"]),
            (TEAM_AGENT, "agent-a", ["agent"]),
        ):
            with grpc.insecure_channel(daemon.target) as channel:
                answer = ToolLedgerStub(channel).ListToolCalls(
                    pb.ListToolCallsRequest(all_namespaces=True),
                    timeout=5,
                    metadata=(("authorization", f"Bearer {token.secret}"),),
                )
            assert (answer.caller, list(answer.caller_roles)) == (name, roles)
    with running_daemon(ServeConfig(data_dir=data / "open", init=True)) as daemon:
        with grpc.insecure_channel(daemon.target) as channel:
            answer = ToolLedgerStub(channel).ListToolCalls(
                pb.ListToolCallsRequest(), timeout=5
            )
        assert (answer.caller, list(answer.caller_roles)) == ("", [])
