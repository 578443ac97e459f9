"""What the daemon's log says of what happens to it (issue 25 item 13): an
access line names the run, call and tool a call is about; the operator's
actions (approvals, rejections, reconciliations, backups, policy reloads)
are logged at info, not only audited; a client that ends its session stream
is not a CANCELLED call at info; and the "serving on" line names every
listener and the provider routes loaded."""

from __future__ import annotations

import logging
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc

from effectd_client import Client, RevisionConflict
from sidecar.config import ServeConfig
from sidecar.rpc.frames import frames_path
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.sessions import Conversation, HeldDaemon, Holds, message, prepare

ACCESS = "effectd.access"


def access(caplog: pytest.LogCaptureFixture, method: str) -> list[dict[str, object]]:
    return [
        r.__dict__
        for r in caplog.records
        if r.name == ACCESS and r.__dict__.get("method") == f"/effectd.v1.{method}"
    ]


def test_an_access_line_names_the_run_the_call_and_the_tool(
    daemon: RunningDaemon, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """PrepareTool names all three in its request; CommitTool names the run
    and the call, and its line takes the tool from the record answered; over
    the session stream as over unary calls (fails before the fix: the line
    had the method, the code and the namespace only)."""
    caplog.set_level(logging.DEBUG, logger=ACCESS)
    held = client.prepare_tool("run-7", "call-3", "send_mail", {"to": "x"}, start=True)
    client.commit_tool("run-7", "call-3", held.call.attempt, {"sent": True})
    (prepared,) = access(caplog, "ToolLedger/PrepareTool")
    (committed,) = access(caplog, "ToolLedger/CommitTool")
    for line in (prepared, committed):
        assert (line["run"], line["call"], line["tool"]) == (
            "run-7",
            "call-3",
            "send_mail",
        )


def test_a_call_that_names_no_tool_call_has_none_in_its_line(
    daemon: RunningDaemon, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=ACCESS)
    client.put_checkpoint("k", b"v")
    (line,) = access(caplog, "Checkpoints/Put")
    assert (line["run"], line["call"], line["tool"]) == (None, None, None)


# -- what operators do, at info -----------------------------------------------


def lines_of(caplog: pytest.LogCaptureFixture, action: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and r.__dict__.get("action") == action
    ]


def test_approvals_rejections_and_reconciliations_are_logged_at_info(
    daemon: RunningDaemon, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Each decision that took effect is one info line naming the call, its
    tool, who and why; a decision refused (a stale revision) logs none
    (fails before the fix: they were only audited)."""
    caplog.set_level(logging.INFO)
    for call_id in ("c-ok", "c-no"):
        client.prepare_tool(
            "run", call_id, "pay", {"c": call_id}, require_approval=True
        )
    for call_id, approve in (("c-ok", True), ("c-no", False)):
        call = client.get_tool_call("run", call_id)
        client.decide_approval(
            "run",
            call_id,
            approve=approve,
            approver="ana",
            reason=f"checked {call_id}",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )
    with pytest.raises(RevisionConflict):
        client.decide_approval(
            "run",
            "c-ok",
            approve=True,
            approver="ana",
            reason="again",
            expected_revision=1,
            input_fingerprint=call.input_fingerprint,
        )
    held = client.prepare_tool("run", "c-lost", "pay", {"c": 3}, start=True)
    lost = client.report_unknown("run", "c-lost", held.call.attempt, "crashed")
    client.reconcile(
        "run",
        "c-lost",
        expected_revision=lost.revision,
        operator="ola",
        reason="found the payment",
        evidence="bank ref 42",
        result={"paid": True},
    )
    assert lines_of(caplog, "approve") == [
        "call default/run/c-ok (pay) approved by ana: checked c-ok"
    ]
    assert lines_of(caplog, "reject") == [
        "call default/run/c-no (pay) rejected by ana: checked c-no"
    ]
    assert lines_of(caplog, "reconcile_committed") == [
        "call default/run/c-lost (pay) reconciled as committed by ola: "
        "found the payment"
    ]


def test_backups_policy_reloads_and_tools_entering_reconciliation_are_logged(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    policy = short_tmp / "policy.toml"
    policy.write_text("")
    config = ServeConfig(data_dir=short_tmp / "data", init=True, policy_file=policy)
    backup = short_tmp / "backup"
    with (
        running_daemon(config) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        admin = admin_pb2_grpc.AdminStub(channel)
        admin.Backup(admin_pb2.BackupRequest(path=str(backup)), timeout=30)
        policy.write_text("[retry]\nretry_safe = false\n")
        admin.ReloadPolicy(admin_pb2.ReloadPolicyRequest(reason="drill"), timeout=30)
        admin.EnterReconciliation(
            admin_pb2.EnterReconciliationRequest(
                tool_name="pay", operator="ola", reason="the bank is down"
            ),
            timeout=30,
        )
    (backed_up,) = lines_of(caplog, "backup")
    assert backed_up.startswith(f"backup of the ledger written to {backup} (")
    (reloaded,) = lines_of(caplog, "policy_reload")
    assert reloaded.startswith(f"policy reloaded from {policy} by operator (audit")
    assert reloaded.endswith("changed: retry.retry_safe")
    assert lines_of(caplog, "enter_reconciliation") == [
        "tool pay put into reconciliation in every namespace by ola: 0 open calls "
        "made a SIDE_EFFECT for good, 0 were one already: the bank is down"
    ]


# -- the session stream's end ------------------------------------------------


def session_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, object]]:
    return [
        (r.levelno, r.__dict__.get("code"))
        for r in caplog.records
        if r.name == ACCESS
        and r.__dict__.get("method") == "/effectd.v1.ToolLedger/Session"
    ]


def _until(check: Callable[[], bool]) -> None:
    """Waits (bounded, 15 s) until `check()`: the daemon records a stream
    once it has seen its end."""
    for _ in range(300):
        if check():
            return
        threading.Event().wait(0.05)


def test_a_client_closing_its_session_is_no_cancelled_call_at_info(
    daemon: RunningDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    """The clients end a session by cancelling its stream: between calls
    that is a normal end, logged at debug, not `Session CANCELLED` at info
    (fails before the fix)."""
    caplog.set_level(logging.DEBUG, logger=ACCESS)
    with Client(daemon.target, session=True) as client:
        client.prepare_tool("run", "c", "pay", {"n": 1})
    _until(lambda: bool(session_lines(caplog)))
    # The client half-closes the stream, then cancels it: which of the two
    # the daemon sees first is a race, and either is a normal end.
    ((level, code),) = session_lines(caplog)
    assert (level, code) in {(logging.DEBUG, "CANCELLED"), (logging.DEBUG, "OK")}


def test_a_session_cut_with_messages_in_flight_is_logged_at_info(
    config: ServeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The control: a stream cancelled while a message is being served is
    a CANCELLED call at info, as before."""
    caplog.set_level(logging.DEBUG, logger=ACCESS)
    holds = Holds()
    with running_daemon(config, daemon=HeldDaemon(config, holds)) as held:
        try:
            with grpc.insecure_channel(held.target) as channel:
                conversation = Conversation(channel)
                conversation.send(message(1, prepare("hold-1")))
                holds.wait_until(lambda h: h.now == 1)
                conversation.cancel()
                holds.wait_until(lambda h: h.cut == 1)
                _until(lambda: bool(session_lines(caplog)))
        finally:
            holds.release()
    assert session_lines(caplog) == [(logging.INFO, "CANCELLED")]


# -- the line that says the daemon serves -------------------------------------


def test_the_serving_line_names_every_listener_and_the_provider_routes(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ports asked as 0 are named as bound: TCP, health and metrics; the
    routes loaded are named (fails before the fix: the line named the
    socket and TCP only)."""
    caplog.set_level(logging.INFO)
    providers = short_tmp / "providers.toml"
    providers.write_text(
        '[routes.openai]\nbase_url = "https://api.openai.com"\n'
        '[routes.anthropic]\nbase_url = "https://api.anthropic.com"\n'
    )
    config = ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        listen="127.0.0.1:0",
        health_listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        providers_file=providers,
    )
    with running_daemon(config) as running:
        daemon = running.daemon
        assert daemon.endpoints is not None
        (line,) = [
            r for r in caplog.records if r.getMessage().startswith("effectd serving on")
        ]
        framed = frames_path(config.socket_path)
        listeners = [
            running.target,
            str(daemon.endpoints.tcp),
            f"frames unix:{framed}",
            f"health {daemon.health_address}",
            f"metrics http://{daemon.metrics_address}/metrics",
        ]
        assert line.__dict__["listeners"] == listeners
        assert ":0" not in " ".join(listeners)
        assert line.__dict__["routes"] == ["anthropic", "openai"]
        assert line.getMessage().startswith(
            f"effectd serving on {', '.join(listeners)}"
        )
        assert line.getMessage().endswith("; provider routes: anthropic, openai")


def test_metrics_on_a_pods_network_are_served_and_said_to_need_a_policy(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An address other than loopback is accepted for the metrics (an
    in-cluster Prometheus scrapes the pod's address), with a warning that
    nothing authenticates them (issue 25 item 16: fails before the fix: the
    daemon refused any address but loopback)."""
    caplog.set_level(logging.WARNING)
    config = ServeConfig(
        data_dir=short_tmp / "data", init=True, metrics_listen="0.0.0.0:0"
    )
    with running_daemon(config) as running:
        address = running.daemon.metrics_address
        assert address is not None
        port = address.rsplit(":", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as page:
            assert b"effectd_" in page.read()
    warned = [r.getMessage() for r in caplog.records if "metrics on" in r.getMessage()]
    assert warned == [
        f"metrics on {address} answer anyone who reaches them, without "
        "authentication: restrict who may (a NetworkPolicy, a firewall)"
    ]
