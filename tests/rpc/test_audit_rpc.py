"""The audit log through the real server (contract §10.5): every approval and
reconciliation leaves one hash-chained entry; VerifyAudit walks the chain and
ListAudit pages through it. The tampering tests edit the stored log with the
daemon stopped and must see VerifyAudit fail: they are the negative controls
of the chain (a verifier that always answered ok would pass the rest)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest
from effectd.v1 import admin_pb2, admin_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.ledger.audit import GENESIS
from sidecar.storage import records
from sidecar.storage.api import Table, WriteView
from sidecar.testing import running_daemon
from tests.rpc.support import prepare_request, ref, refused
from tests.support import postgres

AdminStub = admin_pb2_grpc.AdminStub


@pytest.fixture
def admin_stub(channel: grpc.Channel) -> AdminStub:
    return AdminStub(channel)


@pytest.fixture
def ledger(channel: grpc.Channel) -> ledger_pb2_grpc.ToolLedgerStub:
    return ledger_pb2_grpc.ToolLedgerStub(channel)


def _approve(
    stub: ledger_pb2_grpc.ToolLedgerStub,
    call_id: str,
    *,
    approve: bool = True,
    namespace: str = "",
) -> None:
    call = stub.PrepareTool(
        prepare_request(call_id=call_id, namespace=namespace, require_approval=True),
        timeout=5,
    ).call
    stub.DecideApproval(
        pb.DecideApprovalRequest(
            ref=ref(call_id=call_id, namespace=namespace),
            approve=approve,
            approver="alice",
            reason=f"decided {call_id}",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        ),
        timeout=5,
    )


def _reconcile(stub: ledger_pb2_grpc.ToolLedgerStub, call_id: str) -> None:
    stub.PrepareTool(prepare_request(call_id=call_id, start=True), timeout=5)
    call = stub.ReportUnknown(
        pb.ReportUnknownRequest(ref=ref(call_id=call_id), attempt=1), timeout=5
    ).call
    stub.Reconcile(
        pb.ReconcileRequest(
            ref=ref(call_id=call_id),
            expected_revision=call.revision,
            not_executed=True,
            operator="olga",
            reason="checked",
            evidence=f"no trace of {call_id}",
            confirmed_dead_attempt=1,
        ),
        timeout=5,
    )


def _list(admin: AdminStub, **fields: object) -> list[admin_pb2.AuditEntry]:
    """Every entry of a listing, page by page."""
    entries: list[admin_pb2.AuditEntry] = []
    token = ""
    while True:
        page = admin.ListAudit(
            admin_pb2.ListAuditRequest(page_token=token, **fields),  # type: ignore[arg-type]
            timeout=5,
        )
        entries += page.entries
        token = page.next_page_token
        if not token:
            return entries


def _verify(admin: AdminStub) -> admin_pb2.VerifyAuditResponse:
    return admin.VerifyAudit(admin_pb2.VerifyAuditRequest(), timeout=5)


def test_operator_actions_form_a_verified_chain(
    ledger: ledger_pb2_grpc.ToolLedgerStub, admin_stub: AdminStub, clock: ManualClock
) -> None:
    """Approvals, rejections and reconciliations each append one entry, linked
    to the one before, at the daemon's time; VerifyAudit checks them all."""
    assert (_verify(admin_stub).ok, _verify(admin_stub).entries_checked) == (True, 0)
    _approve(ledger, "a1")
    clock.advance(1)
    _approve(ledger, "a2", approve=False)
    _reconcile(ledger, "r1")
    entries = _list(admin_stub)
    assert [e.sequence for e in entries] == [1, 2, 3]
    assert [e.action for e in entries] == [
        admin_pb2.AUDIT_ACTION_APPROVE,
        admin_pb2.AUDIT_ACTION_REJECT,
        admin_pb2.AUDIT_ACTION_RECONCILE_NOT_EXECUTED,
    ]
    assert entries[0].previous_hash == GENESIS
    assert [e.previous_hash for e in entries[1:]] == [e.hash for e in entries[:-1]]
    assert entries[1].at.ToNanoseconds() == clock.wall_ns()
    assert entries[2].evidence == "no trace of r1"
    verdict = _verify(admin_stub)
    assert (verdict.ok, verdict.entries_checked, verdict.problem) == (True, 3, "")


def test_list_audit_pages_in_both_orders(
    ledger: ledger_pb2_grpc.ToolLedgerStub, admin_stub: AdminStub
) -> None:
    """Oldest first and newest first, page by page, list every entry once."""
    for i in range(5):
        _approve(ledger, f"c{i}")
    first = admin_stub.ListAudit(admin_pb2.ListAuditRequest(page_size=2), timeout=5)
    assert [e.sequence for e in first.entries] == [1, 2]
    assert first.next_page_token
    assert [e.sequence for e in _list(admin_stub, page_size=2)] == [1, 2, 3, 4, 5]
    newest = _list(admin_stub, page_size=2, newest_first=True)
    assert [e.sequence for e in newest] == [5, 4, 3, 2, 1]
    assert [e.ref.call_id for e in newest] == [f"c{i}" for i in reversed(range(5))]


def test_list_audit_filters_by_namespace(
    ledger: ledger_pb2_grpc.ToolLedgerStub, admin_stub: AdminStub
) -> None:
    """A namespace filter lists only entries of records of that namespace, in
    either order; no filter lists all."""
    for i in range(3):
        _approve(ledger, f"a{i}", namespace="team-a")
        _approve(ledger, f"b{i}", namespace="team-b")
    only_a = _list(admin_stub, namespace="team-a", page_size=1)
    assert [e.ref.call_id for e in only_a] == ["a0", "a1", "a2"]
    assert {e.ref.namespace for e in only_a} == {"team-a"}
    newest_b = _list(admin_stub, namespace="team-b", newest_first=True)
    assert [e.ref.call_id for e in newest_b] == ["b2", "b1", "b0"]
    assert len(_list(admin_stub)) == 6


def test_a_token_continues_only_its_own_listing(
    ledger: ledger_pb2_grpc.ToolLedgerStub, admin_stub: AdminStub
) -> None:
    """A page token used with another order or namespace filter is refused,
    as are bad filters and page sizes (INVALID_ARGUMENT)."""
    for i in range(3):
        _approve(ledger, f"c{i}", namespace="team-a")
    token = admin_stub.ListAudit(
        admin_pb2.ListAuditRequest(namespace="team-a", page_size=1), timeout=5
    ).next_page_token
    for other in (
        admin_pb2.ListAuditRequest(namespace="team-b", page_token=token),
        admin_pb2.ListAuditRequest(
            namespace="team-a", newest_first=True, page_token=token
        ),
        admin_pb2.ListAuditRequest(page_token=token),
        admin_pb2.ListAuditRequest(page_token="not a token!"),
    ):
        got = refused(lambda o=other: admin_stub.ListAudit(o, timeout=5))  # type: ignore[misc]
        assert (got.code, got.fields) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            ("page_token",),
        )
    bad = admin_pb2.ListAuditRequest(namespace="no spaces", page_size=1001)
    got = refused(lambda: admin_stub.ListAudit(bad, timeout=5))
    assert set(got.fields or ()) == {"namespace", "page_size"}


def test_refusals_write_no_entry(
    ledger: ledger_pb2_grpc.ToolLedgerStub, admin_stub: AdminStub
) -> None:
    """A refused approval or reconciliation appends nothing: the decision and
    its entry are one write."""
    call = ledger.PrepareTool(prepare_request(require_approval=True), timeout=5).call
    request = pb.DecideApprovalRequest(
        ref=ref(),
        approve=True,
        approver="alice",
        reason="ok",
        expected_revision=call.revision + 1,
        input_fingerprint=call.input_fingerprint,
    )
    refused(lambda: ledger.DecideApproval(request, timeout=5))
    reconcile = pb.ReconcileRequest(
        ref=ref(),
        expected_revision=call.revision,
        not_executed=True,
        operator="olga",
        reason="r",
        evidence="e",
    )
    refused(lambda: ledger.Reconcile(reconcile, timeout=5))
    assert _list(admin_stub) == []
    assert _verify(admin_stub).ok


# -- tampering with the stored log (negative controls) -----------------------------


@contextmanager
def _serving(config: ServeConfig, clock: ManualClock) -> Iterator[AdminStub]:
    with (
        running_daemon(config, clock) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        yield AdminStub(channel)


def _with_entries(config: ServeConfig, clock: ManualClock, n: int) -> None:
    """A daemon that appends `n` entries, then stops."""
    with (
        running_daemon(config, clock) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        for i in range(n):
            _approve(stub, f"c{i}")


def _tamper(config: ServeConfig, fn: Callable[[WriteView], None]) -> None:
    """Writes to the stopped daemon's store directly, through its writer."""
    store = postgres.store_of(config)
    try:
        store.submit(fn).result(timeout=10)
    finally:
        store.close()


def _edit_reason(sequence: int) -> Callable[[WriteView], None]:
    def edit(view: WriteView) -> None:
        raw = records.load_audit(view, sequence)
        assert raw is not None
        doc = json.loads(raw)
        doc["reason"] = "nothing to see here"
        view.put(Table.AUDIT, records.audit_key(sequence), json.dumps(doc).encode())

    return edit


def _remove(sequence: int) -> Callable[[WriteView], None]:
    def remove(view: WriteView) -> None:
        view.delete(Table.AUDIT, records.audit_key(sequence))

    return remove


def test_the_chain_survives_a_restart(config: ServeConfig, clock: ManualClock) -> None:
    """The head is durable: a restarted daemon continues the same chain, and
    an untouched log still verifies (the control for the tests below)."""
    _with_entries(config, clock, 2)
    _with_entries(config, clock, 0)
    with (
        running_daemon(config, clock) as daemon,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        _approve(stub, "after-restart")
        admin = AdminStub(channel)
        verdict = _verify(admin)
        assert (verdict.ok, verdict.entries_checked) == (True, 3)
        assert [e.sequence for e in _list(admin)] == [1, 2, 3]


@pytest.mark.parametrize(
    ("tampering", "expected"),
    [
        # (first bad sequence, entries checked before it, why)
        pytest.param(_edit_reason(2), (2, 1, "edited"), id="edit-middle"),
        pytest.param(_edit_reason(3), (3, 2, "edited"), id="edit-newest"),
        pytest.param(_remove(3), (3, 2, "newest entries removed"), id="remove-newest"),
        pytest.param(_remove(2), (3, 1, "missing or inserted"), id="remove-middle"),
        pytest.param(_remove(1), (2, 0, "missing or inserted"), id="remove-first"),
    ],
)
def test_tampering_with_the_stored_log_fails_verification(
    config: ServeConfig,
    clock: ManualClock,
    tampering: Callable[[WriteView], None],
    expected: tuple[int, int, str],
) -> None:
    """Editing one stored entry, or removing one (the newest included), makes
    VerifyAudit answer not ok with the first bad sequence number and why."""
    _with_entries(config, clock, 3)
    _tamper(config, tampering)
    with _serving(config, clock) as admin:
        verdict = _verify(admin)
    bad, checked, why = expected
    assert (verdict.ok, verdict.first_bad_sequence, verdict.entries_checked) == (
        False,
        bad,
        checked,
    )
    assert why in verdict.problem


def test_an_unreadable_entry_is_reported_not_fatal(
    config: ServeConfig, clock: ManualClock
) -> None:
    """Garbage stored as an entry fails VerifyAudit at that entry, while
    ListAudit still shows every readable entry."""
    _with_entries(config, clock, 3)

    def garbage(view: WriteView) -> None:
        view.put(Table.AUDIT, records.audit_key(2), b"\xff not an entry")

    _tamper(config, garbage)
    with _serving(config, clock) as admin:
        verdict = _verify(admin)
        listed = [e.sequence for e in _list(admin)]
    assert (verdict.ok, verdict.first_bad_sequence) == (False, 2)
    assert "cannot be read" in verdict.problem
    assert listed == [1, 3]
