"""`effectd ctl` end to end (contract §10.8): each command runs in-process through
`sidecar.cli.main` against a real daemon, and once as its own process; the
exit codes are the contract scripts rely on (0 ok, 1 refused, 2 usage,
3 not reachable, 4 audit broken)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc, ledger_pb2_grpc

from effectd_client import Channel, Client, Effect, State
from sidecar.cli import main
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.model import CallRef, Payload, PayloadKind
from sidecar.storage import records
from sidecar.storage.api import Table, WriteView
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import prepare_request, refused
from tests.support.certs import Pki, make_pki
from tests.support.postgres import store_of
from tests.support.processes import ROOT
from tests.support.tokens import ONCALL, TEAM, TEAM_AGENT, tokens_text

RUN = "run-1"
# `backup` copies a data directory's LMDB; the shared store is backed up with
# the database's tools (its refusal: tests/rpc/test_storage_faults_rpc.py).
_LMDB_BACKUP = pytest.mark.parametrize("store_kind", ["lmdb"])
Ctl = Callable[..., tuple[int, str, str]]


@pytest.fixture
def ctl(daemon: RunningDaemon, capsys: pytest.CaptureFixture[str]) -> Ctl:
    """Runs `effectd ctl --target <daemon> ARGS`; answers (code, out, err)."""

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["ctl", "--target", daemon.target, *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _awaiting(client: Client, call_id: str) -> None:
    client.prepare_tool(
        RUN, call_id, "send_email", {"to": call_id}, require_approval=True
    )


def _unknown(client: Client, call_id: str) -> None:
    prepared = client.prepare_tool(RUN, call_id, "charge", {"id": call_id}, start=True)
    client.report_unknown(RUN, call_id, prepared.call.attempt, "the process died")


def _committed(client: Client, call_id: str) -> None:
    prepared = client.prepare_tool(RUN, call_id, "search", {"q": call_id}, start=True)
    client.commit_tool(RUN, call_id, prepared.call.attempt, {"hits": 1})


def _rows(out: str) -> list[list[str]]:
    """The cells of a table, header excluded, up to the first blank line."""
    return [line.split() for line in out.split("\n\n", maxsplit=1)[0].splitlines()[1:]]


def test_list_puts_unknown_and_awaiting_approval_first(
    ctl: Ctl, client: Client
) -> None:
    """Calls that need a human (UNKNOWN, then AWAITING_APPROVAL) come before
    the rest, whatever their key order."""
    _committed(client, "a-done")
    _awaiting(client, "b-approve")
    client.prepare_tool(RUN, "c-new", "search", {"q": 1})
    _unknown(client, "d-unknown")
    code, out, _ = ctl("list")
    assert code == 0
    assert [r[3] for r in _rows(out)] == ["d-unknown", "b-approve", "a-done", "c-new"]
    assert out.splitlines()[0].split() == [
        *("NAMESPACE", "STATE", "RUN", "CALL", "TOOL", "EFFECT", "REV", "ATTEMPT"),
        "AGE",
    ]


def test_list_without_a_namespace_lists_every_namespace_and_says_which(
    ctl: Ctl, daemon: RunningDaemon
) -> None:
    """With no --namespace, `list` finds the calls waiting for a person in
    every namespace the store holds, not only in `default`, and names the
    namespaces it searched; --namespace still narrows it to one (issue 10
    item 30: fails before the fix: it printed "no calls")."""
    for namespace, make in [("tenant-a", _awaiting), ("tenant-b", _unknown)]:
        with Client(daemon.target, namespace=namespace) as c:
            make(c, f"{namespace}-call")
            _committed(c, f"{namespace}-done")
    code, out, _ = ctl("list", "--state", "unknown", "--state", "awaiting_approval")
    assert code == 0
    assert [(r[0], r[1]) for r in _rows(out)] == [
        ("tenant-b", "UNKNOWN"),
        ("tenant-a", "AWAITING_APPROVAL"),
    ]
    assert out.splitlines()[-1] == "2 calls in namespaces tenant-a, tenant-b"
    code, out, _ = ctl("--json", "list")
    assert code == 0
    listed = json.loads(out)
    assert {c["ref"]["namespace"] for c in listed["calls"]} == {"tenant-a", "tenant-b"}
    assert listed["searched_namespaces"] == ["tenant-a", "tenant-b"]
    code, out, _ = ctl("list", "--namespace", "tenant-a")
    assert {r[0] for r in _rows(out)} == {"tenant-a"}
    assert out.splitlines()[-1] == "2 calls in namespace tenant-a"
    assert ctl("list", "--namespace", "default")[1] == "no calls in namespace default\n"


def test_list_of_an_empty_store_says_so(ctl: Ctl) -> None:
    """Nothing stored anywhere: `list` says it searched every namespace."""
    assert ctl("list") == (
        0,
        "no calls in every namespace (the store holds none yet)\n",
        "",
    )


def test_list_filters_by_state_and_run_and_prints_json(
    ctl: Ctl, client: Client
) -> None:
    """`--state` and `--run` narrow the listing and `--json` is parseable."""
    _awaiting(client, "a")
    _unknown(client, "b")
    client.prepare_tool("other-run", "c", "search", {"q": 1}, require_approval=True)
    code, out, _ = ctl("--json", "list", "--state", "awaiting_approval", "--run", RUN)
    assert code == 0
    listed = json.loads(out)["calls"]
    assert [(c["ref"]["call_id"], c["state"]) for c in listed] == [
        ("a", "AWAITING_APPROVAL")
    ]
    assert ctl("list", "--namespace", "elsewhere")[1] == (
        "no calls in namespace elsewhere\n"
    )


def test_show_prints_record_history_approval_and_reconciliation(
    ctl: Ctl, client: Client
) -> None:
    """`show` prints the record, its history and the operator's evidence."""
    _unknown(client, "c1")
    assert (
        ctl(
            "reconcile",
            RUN,
            "c1",
            "--not-executed",
            "--reason",
            "checked",
            "--evidence",
            "no charge in the PSP",
            "--confirm-dead-attempt",
            "1",
        )[0]
        == 0
    )
    code, out, _ = ctl("show", RUN, "c1")
    assert code == 0
    assert "state         PREPARED" in out
    assert "history" in out
    assert "reconciliations" in out
    assert "no charge in the PSP" in out
    code, out, _ = ctl("--json", "show", RUN, "c1")
    shown = json.loads(out)
    assert shown["state"] == "PREPARED"
    assert shown["reconciliations"][0]["evidence"] == "no charge in the PSP"


def test_show_prints_the_kept_input_harmlessly_and_checks_it(
    ctl: Ctl, daemon: RunningDaemon
) -> None:
    """`show` prints the input a call awaiting approval keeps, as sent but with
    control and bidi characters escaped, and says whether it hashes to the
    fingerprint the approval binds; a copy that does not is flagged (issue 10
    item 29: fails before the fix: only the fingerprint was shown)."""
    # A carriage return between tokens and a right-to-left override inside a
    # string: both valid JSON, both able to fool a terminal.
    sent = '{"to":\r"bob\u202e@evil.example", "amount": 5}'
    with grpc.insecure_channel(daemon.target) as channel:
        ledger_pb2_grpc.ToolLedgerStub(channel).PrepareTool(
            prepare_request(RUN, "c1", json=sent, require_approval=True), timeout=5
        )
    code, out, _ = ctl("show", RUN, "c1")
    assert code == 0
    assert "\r" not in out
    assert "\u202e" not in out
    assert '{"to":\\r"bob\\u202e@evil.example", "amount": 5}' in out
    assert "input check   hashes to the input fingerprint" in out
    code, out, _ = ctl("--json", "show", RUN, "c1")
    assert json.loads(out)["kept_input"]["json"] == sent

    def tamper(view: WriteView) -> None:
        old = records.load_call(view, CallRef("default", RUN, "c1"))
        assert old is not None
        kept = Payload(PayloadKind.JSON, b'{"to": "bob", "amount": 5000}')
        records.save_call(view, old, dataclasses.replace(old, kept_input=kept))

    store = daemon.daemon._store
    assert store is not None
    store.submit(tamper).result(timeout=10)
    code, out, _ = ctl("show", RUN, "c1")
    assert "input check   DOES NOT hash to the input fingerprint" in out


def test_approve_binds_revision_and_fingerprint_and_audits_the_approver(
    ctl: Ctl, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approve` reads the record, decides it as $USER by default, and the
    audit log names that approver."""
    monkeypatch.setenv("USER", "carol")
    _awaiting(client, "c1")
    code, out, _ = ctl("approve", RUN, "c1", "--reason", "looks right")
    assert code == 0
    assert _rows(out)[0][0] == "PREPARED"
    assert client.get_tool_call(RUN, "c1").state is State.PREPARED
    code, out, _ = ctl("--json", "audit", "list")
    [entry] = json.loads(out)["entries"]
    assert (entry["actor"], entry["action"]) == ("carol", "APPROVE")
    code, out, _ = ctl("show", RUN, "c1")
    assert "approved by carol" in out


def test_reject_commits_the_rejection(ctl: Ctl, client: Client) -> None:
    """`reject` with an explicit approver leaves the call COMMITTED with an error."""
    _awaiting(client, "c1")
    code, _, _ = ctl("reject", RUN, "c1", "--reason", "no", "--approver", "dave")
    assert code == 0
    call = client.get_tool_call(RUN, "c1")
    assert call.state is State.COMMITTED
    assert call.result is not None
    assert not call.result.ok


def test_reconcile_with_the_result_found(ctl: Ctl, client: Client) -> None:
    """`reconcile --result JSON` commits the result the operator found."""
    _unknown(client, "c1")
    code, out, _ = ctl(
        "--json",
        "reconcile",
        RUN,
        "c1",
        "--result",
        '{"charged": 42}',
        "--reason",
        "found it",
        "--evidence",
        "PSP ref 7",
        "--operator",
        "olga",
    )
    assert code == 0
    assert json.loads(out)["state"] == "COMMITTED"
    call = client.get_tool_call(RUN, "c1")
    assert call.result is not None
    assert call.result.value == {"charged": 42}


def test_reconcile_refuses_a_result_an_mcp_call_could_never_return(
    ctl: Ctl, client: Client
) -> None:
    """An MCP call reconciled with a bare string is refused (exit 1) with the
    CallToolResult shape it wants; nothing changes, and that shape is then
    committed (issue 25 item 5: fails before the fix: it was committed, and
    the resumed MCP agent failed on it forever)."""
    prepared = client.prepare_tool(
        RUN, "m1", "mcp://pay/charge", {"id": 9}, start=True, channel=Channel.MCP
    )
    client.report_unknown(RUN, "m1", prepared.call.attempt, "the process died")
    args = ("reconcile", RUN, "m1", "--reason", "found it", "--evidence", "PSP 7")
    code, _, err = ctl(*args, "--result", '"charged i-9"')
    assert code == 1
    assert "refused: INVALID_REQUEST" in err
    assert (
        "  result: an MCP call's result is an MCP CallToolResult object, e.g. "
        '{"content": [{"type": "text", "text": "..."}], "isError": false}: '
        "the result is a string, not an object"
    ) in err
    assert client.get_tool_call(RUN, "m1").state is State.UNKNOWN
    found = '{"content": [{"type": "text", "text": "charged i-9"}], "isError": false}'
    assert ctl(*args, "--result", found)[0] == 0
    assert client.get_tool_call(RUN, "m1").state is State.COMMITTED


def test_reconcile_not_executed_makes_the_call_startable(
    ctl: Ctl, client: Client, clock: ManualClock
) -> None:
    """`reconcile --not-executed` returns the call to PREPARED once the call
    has been UNKNOWN for the quarantine (3 leases of 30 s by default)."""
    _unknown(client, "c1")
    clock.advance(90)
    code, _, _ = ctl(
        "reconcile",
        RUN,
        "c1",
        "--not-executed",
        "--reason",
        "r",
        "--evidence",
        "nothing in the logs",
    )
    assert code == 0
    assert client.get_tool_call(RUN, "c1").state is State.PREPARED


def test_reconcile_not_executed_in_quarantine_says_how_to_confirm(
    ctl: Ctl, client: Client, clock: ManualClock
) -> None:
    """Before the quarantine ends `--not-executed` is refused (exit 1), saying
    how long is left and how to confirm the attempt dead; with
    `--confirm-dead-attempt 1` it is recorded at once (issue 10 item 8: fails
    before the fix: it was accepted the instant the call became UNKNOWN)."""
    _unknown(client, "c1")
    clock.advance(30)
    args = ("reconcile", RUN, "c1", "--not-executed", "--reason", "r")
    code, _, err = ctl(*args, "--evidence", "nothing in the PSP")
    assert code == 1
    assert "refused: RECONCILE_QUARANTINE" in err
    assert "60.0 s left" in err
    assert "--confirm-dead-attempt 1" in err
    assert client.get_tool_call(RUN, "c1").state is State.UNKNOWN
    code, _, err = ctl(
        *args, "--evidence", "killed pid 4242", "--confirm-dead-attempt", "2"
    )
    assert (code, "refused: STALE_ATTEMPT" in err) == (1, True)
    code, _, _ = ctl(
        *args, "--evidence", "killed pid 4242", "--confirm-dead-attempt", "1"
    )
    assert code == 0
    assert client.get_tool_call(RUN, "c1").state is State.PREPARED


def test_enter_reconciliation_makes_a_tools_open_calls_side_effects(
    ctl: Ctl, client: Client
) -> None:
    """`enter-reconciliation TOOL` makes every open call of the tool a side
    effect for good (exit 0, counts printed; `show` tells), so an unknown READ
    of it answers RECONCILE (issue 10 item 10: fails before the fix: no such
    command, exit 2)."""
    p = client.prepare_tool(
        RUN, "r1", "lookup", {"q": 1}, effect=Effect.READ, start=True
    )
    client.report_unknown(RUN, "r1", p.call.attempt, "timeout")
    client.prepare_tool(RUN, "r2", "lookup", {"q": 2}, effect=Effect.READ)
    _unknown(client, "c1")  # another tool
    code, out, err = ctl(
        "enter-reconciliation", "lookup", "--reason", "dup", "--operator", "olga"
    )
    assert code == 0, err
    shown = dict(line.split(None, 1) for line in out.splitlines() if "  " in line)
    assert "now side effects  2" in out
    assert shown["already"].strip() == "0"
    again = client.prepare_tool(RUN, "r1", "lookup", {"q": 1}, effect=Effect.READ)
    assert again.decision.name == "RECONCILE"
    assert client.get_tool_call(RUN, "r1").forced_effect is Effect.SIDE_EFFECT
    code, out, _ = ctl("show", RUN, "r1")
    assert "READ, forced to SIDE_EFFECT" in out
    code, out, _ = ctl("--json", "enter-reconciliation", "lookup", "--reason", "again")
    assert (code, json.loads(out)["already_side_effect"]) == (0, 2)


def test_recover_prints_the_plan(ctl: Ctl, client: Client) -> None:
    """`recover RUN` prints one action per call and whether the run is interrupted."""
    _committed(client, "a")
    _unknown(client, "b")
    code, out, _ = ctl("recover", RUN)
    assert code == 0
    assert [r[:2] for r in _rows(out)[:2]] == [
        ["REPLAY_RESULT", "a"],
        ["RECONCILE", "b"],
    ]
    assert "interrupted: yes" in out
    plan = json.loads(ctl("--json", "recover", RUN)[1])
    assert plan["interrupted"] is True
    assert [i["action"] for i in plan["items"]] == ["REPLAY_RESULT", "RECONCILE"]


def test_audit_verify_of_an_intact_log(ctl: Ctl, client: Client) -> None:
    """`audit verify` exits 0 and counts the entries of an untouched chain."""
    _awaiting(client, "c1")
    ctl("approve", RUN, "c1", "--reason", "ok", "--approver", "a")
    code, out, _ = ctl("audit", "verify")
    assert (code, out) == (0, "audit log intact: 1 entries verified\n")


def _edit_reason(sequence: int) -> Callable[[WriteView], None]:
    def edit(view: WriteView) -> None:
        raw = records.load_audit(view, sequence)
        assert raw is not None
        doc = json.loads(raw)
        doc["reason"] = "nothing to see here"
        view.put(Table.AUDIT, records.audit_key(sequence), json.dumps(doc).encode())

    return edit


def test_audit_verify_of_a_tampered_log_exits_4(
    config: ServeConfig, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """An audit entry edited behind the daemon's back makes `audit verify`
    exit 4 and name the entry (the negative control of the test above)."""
    with running_daemon(config, clock) as d, Client(d.target) as client:
        for call_id in ("c1", "c2"):
            _awaiting(client, call_id)
            assert (
                main(
                    [
                        "ctl",
                        "--target",
                        d.target,
                        "approve",
                        RUN,
                        call_id,
                        "--reason",
                        "ok",
                        "--approver",
                        "a",
                    ]
                )
                == 0
            )
    store = store_of(config)
    try:
        store.submit(_edit_reason(1)).result(timeout=10)
    finally:
        store.close()
    with running_daemon(config, clock) as d:
        capsys.readouterr()
        assert main(["ctl", "--target", d.target, "audit", "verify"]) == 4
        assert "BROKEN at entry 1" in capsys.readouterr().out
        assert main(["ctl", "--target", d.target, "--json", "audit", "verify"]) == 4
        verdict = json.loads(capsys.readouterr().out)
        assert (verdict["ok"], verdict["first_bad_sequence"]) == (False, 1)


@_LMDB_BACKUP
def test_backup_while_serving_restores_into_a_new_data_directory(
    ctl: Ctl, client: Client, short_tmp: Path, clock: ManualClock
) -> None:
    """`backup PATH` copies the live store (0700/0600); a daemon started, as
    ctl's hint says, on a copy of it serves the records it held, a call then
    in flight as UNKNOWN, and leaves the backup as it was (issue 10 item 31:
    fails before the fix: the hint said to start a daemon on the backup)."""
    _committed(client, "c1")
    client.prepare_tool(RUN, "c2", "charge", {"n": 2}, start=True)
    backup = short_tmp / "backup"
    code, out, _ = ctl("backup", str(backup))
    assert code == 0
    hint = out.splitlines()[-1].strip()
    assert hint == (
        "restore (offline, the daemon stopped): "
        f"effectd ctl restore {backup} --data-dir DIR"
    )
    _committed(client, "after-the-backup")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o700
    assert stat.S_IMODE((backup / "data.mdb").stat().st_mode) == 0o600
    kept = (backup / "data.mdb").read_bytes()
    copy = short_tmp / "restored"
    subprocess.run(["cp", "-a", str(backup), str(copy)], check=True)
    with (
        running_daemon(ServeConfig(data_dir=copy), clock) as restored,
        Client(restored.target) as c,
    ):
        call = c.get_tool_call(RUN, "c1")
        assert call.state is State.COMMITTED
        assert call.result is not None
        assert call.result.value == {"hits": 1}
        assert [x.call_id for x in c.list_tool_calls()] == ["c1", "c2"]
        assert c.get_tool_call(RUN, "c2").state is State.UNKNOWN
    assert (backup / "data.mdb").read_bytes() == kept


@_LMDB_BACKUP
def test_backup_into_a_non_empty_directory_is_refused(
    ctl: Ctl, short_tmp: Path
) -> None:
    """A backup never overwrites: a non-empty PATH exits 1 with INVALID_REQUEST
    and the field that is wrong."""
    full = short_tmp / "full"
    full.mkdir()
    (full / "precious").write_text("keep")
    code, out, err = ctl("backup", str(full))
    assert (code, out) == (1, "")
    assert "refused: INVALID_REQUEST" in err
    assert "path: must be a new or empty" in err
    assert os.listdir(full) == ["precious"]


@_LMDB_BACKUP
@pytest.mark.parametrize(
    "where", ["a-file", "no-parent/backup"], ids=["a file", "a missing parent"]
)
def test_backup_into_anything_but_a_directory_is_refused(
    ctl: Ctl, short_tmp: Path, where: str
) -> None:
    """A PATH that is a file, or whose parent is missing, exits 1 with
    INVALID_REQUEST and creates nothing."""
    (short_tmp / "a-file").write_text("keep")
    code, _, err = ctl("backup", str(short_tmp / where))
    assert code == 1
    assert "path: must be a new or empty directory" in err
    assert not (short_tmp / "no-parent").exists()
    assert (short_tmp / "a-file").read_text() == "keep"


def test_backup_rpc_refuses_a_relative_path(daemon: RunningDaemon) -> None:
    """Admin.Backup names no directory relative to the daemon's cwd."""
    with grpc.insecure_channel(daemon.target) as channel:
        refusal = refused(
            lambda: admin_pb2_grpc.AdminStub(channel).Backup(
                admin_pb2.BackupRequest(path="relative/backup"), timeout=5
            )
        )
    assert refusal.code is grpc.StatusCode.INVALID_ARGUMENT
    assert refusal.fields == ("path",)


@_LMDB_BACKUP
def test_a_backup_under_concurrent_writes_is_consistent(
    ctl: Ctl, daemon: RunningDaemon, client: Client, short_tmp: Path
) -> None:
    """Approvals written while the copy runs leave a copy whose audit chain
    verifies and whose records all match their audit entries."""
    for i in range(40):
        _awaiting(client, f"c{i:02}")
    stop = threading.Event()

    def approve() -> None:
        with Client(daemon.target) as writer:
            for i in range(40):
                if stop.is_set():
                    return
                seen = writer.get_tool_call(RUN, f"c{i:02}")
                writer.decide_approval(
                    RUN,
                    f"c{i:02}",
                    approve=True,
                    approver="w",
                    reason="r",
                    expected_revision=seen.revision,
                    input_fingerprint=seen.input_fingerprint,
                )

    thread = threading.Thread(target=approve)
    thread.start()
    try:
        copies = [short_tmp / f"copy{n}" for n in range(3)]
        for copy in copies:
            assert ctl("backup", str(copy))[0] == 0
    finally:
        stop.set()
        thread.join(timeout=60)
    for copy in copies:
        with (
            running_daemon(ServeConfig(data_dir=copy)) as restored,
            Client(restored.target) as c,
        ):
            approved = [x for x in c.list_tool_calls() if x.state is State.PREPARED]
            assert main(["ctl", "--target", restored.target, "audit", "verify"]) == 0
            assert len(approved) == _audit_count(restored.target)


def _audit_count(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        page = admin_pb2_grpc.AdminStub(channel).ListAudit(
            admin_pb2.ListAuditRequest(page_size=1000), timeout=5
        )
    return len(page.entries)


def test_policy_reload(short_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`policy reload` puts the edited policy file in force and names the change."""
    policy = short_tmp / "policy.toml"
    policy.write_text("")
    config = ServeConfig(data_dir=short_tmp / "data", init=True, policy_file=policy)
    with running_daemon(config) as d:
        policy.write_text("[retry]\nretry_safe = false\n")
        capsys.readouterr()
        argv = ["ctl", "--target", d.target, "--json", "policy", "reload"]
        assert main([*argv, "--reason", "incident 12"]) == 0
        done = json.loads(capsys.readouterr().out)
        assert done["changed"] == ["retry.retry_safe"]
        assert done["policy"]["retry_safe"] is False


def test_a_refusal_exits_1_with_the_reason(ctl: Ctl, client: Client) -> None:
    """A refused command exits 1 and prints the ErrorInfo reason and message;
    with --json the refusal is also a JSON document."""
    client.prepare_tool(RUN, "c1", "search", {"q": 1})
    code, _, err = ctl("approve", RUN, "c1", "--reason", "r", "--approver", "a")
    assert code == 1
    assert "refused: INVALID_TRANSITION" in err
    code, out, err = ctl("--json", "policy", "reload")
    assert code == 1
    assert json.loads(out)["error"]["reason"] == "NO_POLICY_FILE"
    assert ctl("show", RUN, "missing")[0] == 1


def test_an_unreachable_daemon_exits_3_naming_the_socket(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a daemon ctl exits 3, names the socket and suggests `make run`."""
    sock = short_tmp / "effectd.sock"
    assert main(["ctl", "--socket", str(sock), "--timeout", "2", "list"]) == 3
    err = capsys.readouterr().err
    assert f"not reachable at unix:{sock}" in err
    assert "make run" in err


def test_the_default_socket_follows_effectd_data_dir(
    daemon: RunningDaemon, config: ServeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no --socket or --target, ctl finds $EFFECTD_DATA_DIR/effectd.sock."""
    monkeypatch.setenv("EFFECTD_DATA_DIR", str(config.data_dir))
    assert main(["ctl", "audit", "verify"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--state", "nope"],
        ["reconcile", RUN, "c1", "--reason", "r", "--evidence", "e"],
        ["reconcile", RUN, "c1", "--result", "{x", "--reason", "r", "--evidence", "e"],
        ["approve", RUN, "c1"],
        ["--socket", "s", "--target", "t", "list"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    """Malformed command lines exit 2 before anything is sent."""
    with pytest.raises(SystemExit) as info:
        main(["ctl", *argv])
    assert info.value.code == 2


@pytest.mark.slow
def test_as_a_process(daemon: RunningDaemon, client: Client) -> None:
    """`python -m sidecar ctl` run as its own process lists and refuses with
    the documented exit codes."""
    _unknown(client, "c1")

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sidecar", "ctl", "--target", daemon.target, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = ctl("--json", "list", "--state", "unknown")
    assert done.returncode == 0, done.stderr
    listed: list[dict[str, Any]] = json.loads(done.stdout)["calls"]
    assert [c["ref"]["call_id"] for c in listed] == ["c1"]
    refused = ctl("reject", RUN, "c1", "--reason", "r")
    assert refused.returncode == 1
    assert "INVALID_TRANSITION" in refused.stderr


# -- credentials: token file, EFFECTD_TOKEN, TLS ------------------------------

AGENT, OPERATOR = TEAM_AGENT.secret, ONCALL.secret
TOKENS = tokens_text(*TEAM)


@pytest.fixture
def auth_daemon(short_tmp: Path) -> Iterator[RunningDaemon]:
    """A daemon that requires bearer tokens (TOKENS)."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True, tokens_text=TOKENS)
    with running_daemon(config) as running:
        yield running


def _token_file(directory: Path, token: str, mode: int = 0o600) -> Path:
    path = directory / f"token-{mode:o}"
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["ctl", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_token_file_or_effectd_token_authenticates(
    auth_daemon: RunningDaemon,
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's token from a 0600 file, or from EFFECTD_TOKEN, lists the
    agent's calls of its namespace."""
    with Client(auth_daemon.target, token=AGENT) as agent:
        _unknown(agent, "c1")
    where = ("--target", auth_daemon.target, "--namespace", "team-a")
    token = _token_file(short_tmp, OPERATOR)
    code, out, err = _main(capsys, *where, "--token-file", str(token), "list")
    assert code == 0, err
    assert [row[1] for row in _rows(out)] == ["UNKNOWN"]
    monkeypatch.setenv("EFFECTD_TOKEN", OPERATOR)
    code, out, err = _main(capsys, *where, "--json", "list")
    assert code == 0, err
    assert [c["ref"]["call_id"] for c in json.loads(out)["calls"]] == ["c1"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_token_file_others_may_access_is_refused_with_exit_2(
    short_tmp: Path, capsys: pytest.CaptureFixture[str], mode: int
) -> None:
    """A token readable (or writable) by group or others is refused before
    anything is sent: exit 2 against a daemon that is not even there (it
    would be 3 if ctl tried), the fix named, the token not printed."""
    token = _token_file(short_tmp, OPERATOR, mode)
    absent = f"unix:{short_tmp / 'absent.sock'}"
    code, _, err = _main(capsys, "--target", absent, "--token-file", str(token), "list")
    assert code == 2
    assert f"mode {mode:04o}" in err
    assert "chmod 600" in err
    assert OPERATOR not in err
    token.chmod(0o600)  # the control: the same file, private, gets as far as 3
    code, _, _ = _main(
        capsys, "--target", absent, "--timeout", "2", "--token-file", str(token), "list"
    )
    assert code == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "No such file"), ("", "empty"), ("two words", "token")],
)
def test_a_missing_empty_or_malformed_token_file_exits_2(
    short_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    message: str,
) -> None:
    """Every unusable token file is a usage error that names the problem."""
    path = short_tmp / "token"
    if content is not None:
        _token_file(short_tmp, content).rename(path)
    code, _, err = _main(
        capsys, "--target", "unix:x.sock", "--token-file", str(path), "list"
    )
    assert code == 2
    assert message in err


def test_without_a_token_ctl_exits_1_unauthenticated(
    auth_daemon: RunningDaemon,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No token: refused as UNAUTHENTICATED (exit 1), saying how to give one."""
    monkeypatch.delenv("EFFECTD_TOKEN", raising=False)
    code, _, err = _main(capsys, "--target", auth_daemon.target, "list")
    assert code == 1
    assert "refused: UNAUTHENTICATED" in err
    assert "--token-file" in err


def test_an_agent_token_may_not_reconcile_exit_1_permission_denied(
    auth_daemon: RunningDaemon, short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent's token reconciling: PERMISSION_DENIED (exit 1) naming the
    role; the operator's (the control) reconciles."""
    with Client(auth_daemon.target, token=AGENT) as agent:
        _unknown(agent, "c1")
    reconcile = ("reconcile", RUN, "c1", "--not-executed")
    why: tuple[str, ...] = ("--reason", "checked", "--evidence", "no charge")
    why += ("--confirm-dead-attempt", "1")
    where = ("--target", auth_daemon.target, "--namespace", "team-a")
    agent_token = _token_file(short_tmp, AGENT)
    code, _, err = _main(
        capsys, *where, "--token-file", str(agent_token), *reconcile, *why
    )
    assert code == 1
    assert "refused: PERMISSION_DENIED" in err
    assert "operator" in err
    operator_token = _token_file(short_tmp, OPERATOR, 0o400)
    code, _, err = _main(
        capsys, *where, "--token-file", str(operator_token), *reconcile, *why
    )
    assert code == 0, err
    # No --operator: the audit names the token, not the shell's $USER.
    code, out, _ = _main(
        capsys, *where, "--token-file", str(operator_token), "show", RUN, "c1"
    )
    assert code == 0
    reconciled = out.split("\nreconciliations\n")[1]
    assert "oncall" in _rows(reconciled)[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["--tls-cert", "{pki}/client.pem"],
        ["--tls-key", "{pki}/client-key.pem"],
        ["--tls-ca", "{pki}/missing.pem"],
    ],
    ids=["cert-without-key", "key-without-cert", "missing-ca"],
)
def test_bad_tls_options_exit_2(
    pki: Pki, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Half a client identity or an unreadable PEM file is a usage error."""
    args = [a.format(pki=pki.ca.parent) for a in argv]
    code, _, err = _main(capsys, "--target", "127.0.0.1:1", *args, "list")
    assert code == 2
    assert "--tls-" in err


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_ctl_over_mutual_tls(
    short_tmp: Path, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against a TLS listener requiring client certificates: with the CA, the
    client certificate and a token ctl is served; without the CA the
    handshake fails, and ctl says so (exit 5), not "not reachable"."""
    config = ServeConfig(
        data_dir=short_tmp / "data",
        init=True,
        tokens_text=TOKENS,
        listen="127.0.0.1:0",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca,
    )
    token = _token_file(short_tmp, OPERATOR)
    with running_daemon(config) as running:
        target = running.endpoints.tcp
        assert target is not None
        where = ("--target", target, "--token-file", str(token), "--timeout", "5")
        identity = (
            "--tls-cert",
            str(pki.client.cert),
            "--tls-key",
            str(pki.client.key),
        )
        code, _, err = _main(
            capsys, *where, "--tls-ca", str(pki.ca), *identity, "audit", "verify"
        )
        assert code == 0, err
        code, _, err = _main(capsys, *where, *identity, "audit", "verify")
        assert code == 5
        assert "not reachable" not in err


def _mutual_tls(short_tmp: Path, pki: Pki) -> ServeConfig:
    return ServeConfig(
        data_dir=short_tmp / "tls",
        init=True,
        tokens_text=TOKENS,
        listen="127.0.0.1:0",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=pki.ca,
    )


@pytest.mark.parametrize(
    "case",
    [
        ([], 5, "it probably serves TLS; pass --tls-ca"),
        (["--tls-ca", "{untrusted_ca}"], 5, "certificate is not trusted"),
        (["--tls-ca", "{ca}"], 5, "requires a client certificate"),
        (
            [
                *("--tls-ca", "{ca}"),
                *("--tls-cert", "{untrusted_client}", "--tls-key", "{untrusted_key}"),
            ],
            5,
            "refused the client certificate",
        ),
        (
            [
                *("--tls-ca", "{ca}"),
                *("--tls-cert", "{client}", "--tls-key", "{client_key}"),
            ],
            1,
            "refused: UNAUTHENTICATED",
        ),
    ],
    ids=["plaintext", "untrusted-ca", "no-client-cert", "foreign-client", "no-token"],
)
def test_tls_and_authentication_failures_are_not_unreachable(
    short_tmp: Path,
    pki: Pki,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[list[str], int, str],
) -> None:
    """Each TLS mistake against a mutual-TLS listener exits 5 and names the
    fix; a missing token exits 1 UNAUTHENTICATED; none of them says the
    daemon is not reachable (issue 10 item 32: fails before the fix: each
    TLS mistake exited 3, "not reachable ... start one with make run")."""
    options, code, says = case
    monkeypatch.delenv("EFFECTD_TOKEN", raising=False)
    files = {
        "ca": pki.ca,
        "untrusted_ca": pki.untrusted_ca,
        "client": pki.client.cert,
        "client_key": pki.client.key,
        "untrusted_client": pki.untrusted_client.cert,
        "untrusted_key": pki.untrusted_client.key,
    }
    argv = [o.format(**files) for o in options]
    with running_daemon(_mutual_tls(short_tmp, pki)) as running:
        target = running.endpoints.tcp
        assert target is not None
        got, _, err = _main(
            capsys, "--target", target, "--timeout", "5", *argv, "audit", "verify"
        )
    assert (got, says in err) == (code, True), err
    assert "not reachable" not in err
    assert "make run" not in err


def test_tls_to_a_plaintext_listener_exits_5(
    short_tmp: Path, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    """ctl speaking TLS to a loopback listener without it: exit 5, saying the
    daemon does not serve TLS there; the control, nothing listening, is
    still exit 3 (issue 10 item 32: fails before the fix: it exited 3)."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True, listen="127.0.0.1:0")
    with running_daemon(config) as running:
        target = running.endpoints.tcp
        assert target is not None
        argv = ("--timeout", "5", "--tls-ca", str(pki.ca), "audit", "verify")
        code, _, err = _main(capsys, "--target", target, *argv)
        assert code == 5
        assert "does not serve TLS there" in err
    code, _, err = _main(capsys, "--target", target, *argv)
    assert code == 3
    assert "not reachable" in err


def test_stats_counts_open_calls_by_state_and_bytes(
    ctl: Ctl, client: Client, daemon: RunningDaemon
) -> None:
    """`stats` shows what waits for a person (AWAITING, UNKNOWN), the open
    calls the quota counts and the bytes stored, per namespace."""
    _committed(client, "done")
    _awaiting(client, "approve-me")
    _unknown(client, "lost")
    client.prepare_tool(RUN, "ready", "search", {"q": 1})
    with Client(daemon.target, namespace="other") as other:
        other.prepare_tool(RUN, "x", "search", {"q": 2})
    code, out, _ = ctl("--json", "stats")
    assert code == 0
    answer = json.loads(out)
    by_name = {n["namespace"]: n for n in answer["namespaces"]}
    assert set(by_name) == {"default", "other"}
    mine = by_name["default"]
    assert mine["open_calls"] == 3
    assert (mine["prepared"], mine["awaiting_approval"], mine["unknown"]) == (1, 1, 1)
    assert mine["stored_bytes"] > 0
    assert by_name["other"]["open_calls"] == 1
    code, out, _ = ctl("--namespace", "other", "stats")
    assert code == 0
    assert [row[0] for row in _rows(out.split("\n\n")[0])] == ["other"]
    assert "open calls 10000" in out
