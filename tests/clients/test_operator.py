"""The client's operator surface (`client.admin`, `client.operator`), on a
real daemon: it covers every RPC of the Admin service and every operator RPC
of ToolLedger and Recovery, sync and async alike, answers the daemon's whole
records, and maps refusals to the same exception classes as the rest of the
client."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import pytest
from effectd.v1 import admin_pb2, ledger_pb2, recovery_pb2

from effectd_client import (
    Admin,
    AsyncAdmin,
    AsyncClient,
    AsyncOperator,
    Client,
    Effect,
    NoPolicyFile,
    NotFound,
    NotImplementedYet,
    Operator,
    RevisionConflict,
    State,
)
from sidecar.testing import RunningDaemon

# The RPCs a person's tools send, each to the surface's method that sends it.
OPERATOR_RPCS = {
    ("ToolLedger", "GetToolCall"): (Operator, "record"),
    ("ToolLedger", "ListToolCalls"): (Operator, "list_page"),
    ("ToolLedger", "DecideApproval"): (Operator, "decide"),
    ("ToolLedger", "Reconcile"): (Operator, "reconcile"),
    ("Recovery", "Recover"): (Operator, "recover_pages"),
}
ADMIN_METHODS = {
    "VerifyAudit": "verify_audit",
    "ListAudit": "list_audit",
    "ReloadPolicy": "reload_policy",
    "Backup": "backup",
    "GetStats": "stats",
    "EnterReconciliation": "enter_reconciliation",
    "ListDaemons": "daemons",
}


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if callable(fn) and not name.startswith("_")
    }


def test_every_admin_rpc_has_a_method() -> None:
    """Each RPC the Admin service declares is named in the table, and the
    method the table names sends it (its stub attribute is in its source);
    a new Admin RPC fails here until the surface has it."""
    declared = set(admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods_by_name)
    assert declared == set(ADMIN_METHODS)
    for rpc, method in ADMIN_METHODS.items():
        source = inspect.getsource(getattr(Admin, method))
        assert f"self._stub.{rpc}" in source, (rpc, method)


def test_the_operator_rpcs_have_methods() -> None:
    """Each operator RPC of ToolLedger and Recovery is sent by the method
    the table names, and the services declare every RPC the table names."""
    files = {"ToolLedger": ledger_pb2, "Recovery": recovery_pb2}
    for (service, rpc), (cls, method) in OPERATOR_RPCS.items():
        methods = files[service].DESCRIPTOR.services_by_name[service].methods_by_name
        assert rpc in methods
        stub = "_ledger" if service == "ToolLedger" else "_recovery"
        assert f"self.{stub}.{rpc}" in inspect.getsource(getattr(cls, method))


@pytest.mark.parametrize(
    ("sync", "aio"), [(Admin, AsyncAdmin), (Operator, AsyncOperator)]
)
def test_the_async_surface_has_the_sync_ones_methods(sync: type, aio: type) -> None:
    """Every public method of the sync surface exists awaited, with the
    same parameters."""
    left, right = _public(sync), _public(aio)
    assert left.keys() == right.keys()
    for name, signature in left.items():
        assert list(signature.parameters) == list(right[name].parameters), name


def test_an_approval_through_the_operator_surface(daemon: RunningDaemon) -> None:
    """A person reads the whole record, approves it bound to what was read,
    and the audit log and the stats say so; a decision on a stale revision is
    RevisionConflict, as from any other call of the client."""
    with Client(daemon.target) as client:
        client.prepare_tool("run-1", "pay", "pay", {"cents": 5}, require_approval=True)
        seen = client.operator.record("run-1", "pay")
        assert isinstance(seen, ledger_pb2.ToolCall)
        assert seen.state == ledger_pb2.CALL_STATE_AWAITING_APPROVAL
        assert seen.kept_input.json == '{"cents":5}'
        waiting = client.operator.calls(
            states=(State.AWAITING_APPROVAL,), all_namespaces=True
        )
        assert [c.ref.call_id for c in waiting] == ["pay"]
        assert client.admin.stats().namespaces[0].awaiting_approval == 1
        done = client.operator.decide(
            "run-1",
            "pay",
            approve=True,
            approver="alice",
            reason="checked",
            expected_revision=seen.revision,
            input_fingerprint=seen.input_fingerprint,
        )
        assert done.approval.approver == "alice"
        assert [t.event for t in done.history][-1] == "approve"
        with pytest.raises(RevisionConflict):
            client.operator.decide(
                "run-1",
                "pay",
                approve=False,
                approver="alice",
                reason="late",
                expected_revision=seen.revision,
                input_fingerprint=seen.input_fingerprint,
            )
        entries = client.admin.audit_entries(newest_first=True, limit=1)
        assert [e.action for e in entries] == [admin_pb2.AUDIT_ACTION_APPROVE]
        assert client.admin.verify_audit().ok
        assert client.operator.caller().roles == ()


def test_reconcile_recover_and_the_store_views(
    daemon: RunningDaemon, short_tmp: Path, store_kind: str
) -> None:
    """The unknown outcome is reconciled, the plan read, a tool put into
    reconciliation, the store backed up (LMDB's; the shared store's backup
    is the database's, refused NotImplementedYet) and the daemons listed; a
    refusal is the client's class of its reason, a missing call NotFound."""
    with Client(daemon.target) as client:
        held = client.prepare_tool("run-2", "charge", "charge", {"c": 1}, start=True)
        client.report_unknown("run-2", "charge", held.call.attempt, "worker died")
        plan = client.operator.recover("run-2")
        assert [i.call.ref.call_id for i in plan.items] == ["charge"]
        seen = client.operator.record("run-2", "charge")
        done = client.operator.reconcile(
            "run-2",
            "charge",
            expected_revision=seen.revision,
            operator="bob",
            reason="found",
            evidence="dashboard",
            result={"id": "ch_1"},
        )
        assert done.state == ledger_pb2.CALL_STATE_COMMITTED
        assert done.reconciliations[0].operator == "bob"
        client.prepare_tool(
            "run-3", "open", "mailer", {"to": "x"}, effect=Effect.IDEMPOTENT_WRITE
        )
        entered = client.admin.enter_reconciliation(
            "mailer", reason="duplicated", operator="bob"
        )
        assert entered.prepared == 1
        if store_kind == "lmdb":
            assert client.admin.backup(str(short_tmp / "backup")).bytes > 0
        else:
            with pytest.raises(NotImplementedYet):
                client.admin.backup(str(short_tmp / "backup"))
        assert len(client.admin.daemons().daemons) == 1
        with pytest.raises(NoPolicyFile):
            client.admin.reload_policy("no file")
        with pytest.raises(NotFound):
            client.operator.record("run-2", "missing")


def test_the_async_surface_on_a_daemon(daemon: RunningDaemon) -> None:
    """The awaited surface reads, decides, pages and refuses as the sync one."""

    async def body() -> None:
        async with AsyncClient(daemon.target) as client:
            await client.prepare_tool(
                "run-4", "pay", "pay", {"cents": 7}, require_approval=True
            )
            seen = await client.operator.record("run-4", "pay")
            done = await client.operator.decide(
                "run-4",
                "pay",
                approve=False,
                approver="carol",
                reason="no",
                expected_revision=seen.revision,
                input_fingerprint=seen.input_fingerprint,
            )
            assert done.state == ledger_pb2.CALL_STATE_COMMITTED
            pages = [p async for p in client.operator.recover_pages("run-4")]
            assert [i.call.ref.call_id for p in pages for i in p.items] == ["pay"]
            assert (await client.admin.verify_audit()).ok
            entries = await client.admin.audit_entries(limit=5)
            assert [e.action for e in entries] == [admin_pb2.AUDIT_ACTION_REJECT]
            assert (await client.admin.stats()).incarnation > 0
            assert (await client.operator.caller()).name == ""
            with pytest.raises(NoPolicyFile):
                await client.admin.reload_policy()

    asyncio.run(body())


def test_the_table_names_the_methods_as_they_are() -> None:
    """The tables above name methods that exist (a renamed method fails
    here rather than silently leaving an RPC untested)."""
    names = set(ADMIN_METHODS.values()) | {m for _, m in OPERATOR_RPCS.values()}
    for name in names:
        assert re.fullmatch(r"[a-z_]+", name)
        assert hasattr(Admin, name) or hasattr(Operator, name), name
