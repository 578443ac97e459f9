"""Tenant isolation: every RPC x a token of namespace A x a record or key of
namespace B answers NOT_FOUND or PERMISSION_DENIED, never B's data, and
changes nothing of B (contract §3.1, §10.2; reliability-anchors §7)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2, recovery_pb2, retry_pb2
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb

from sidecar.auth import access
from sidecar.composition import SERVICES
from sidecar.ledger import paging
from sidecar.rpc.caller import Caller
from tests.auth.support import (
    AGENT_A,
    AGENT_AB,
    AGENT_B,
    APPROVER_A,
    OPERATOR_A,
    OPERATOR_ALL,
    Stubs,
    authenticated_daemon,
    stubs,
)
from tests.rpc.sessions import SessionRefused, message, refusal

MARKER = "MARKER-OF-B-7f3a"
RUN = "run-b"
ISOLATING = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED}
# The Provider service reaches configured upstream routes and keeps no
# records: nothing of a namespace to reach.
NOT_NAMESPACED = {
    "/effectd.v1.Provider/ProviderCall",
    "/effectd.v1.Provider/ProviderStream",
}


def ref(call_id: str, namespace: str = "b") -> pb.CallRef:
    return pb.CallRef(namespace=namespace, run_id=RUN, call_id=call_id)


def payload() -> pb.Payload:
    return pb.Payload(json=f'{{"secret": "{MARKER}"}}')


@dataclass(frozen=True, slots=True)
class Seeded:
    committed: pb.ToolCall
    awaiting: pb.ToolCall
    started: pb.ToolCall


def seed(b: Stubs, operator_all: Stubs) -> Seeded:
    """Namespace B's records: a committed call, one awaiting approval, one
    started, one rejected by an operator (an audit entry of B), a checkpoint."""
    md = b.metadata
    done = b.ledger.PrepareTool(
        pb.PrepareToolRequest(
            ref=ref("done"), tool_name="pay", input=payload(), start=True
        ),
        metadata=md,
    ).call
    committed = b.ledger.CommitTool(
        pb.CommitToolRequest(
            ref=ref("done"),
            attempt=done.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=payload()),
        ),
        metadata=md,
    ).call
    awaiting = b.ledger.PrepareTool(
        pb.PrepareToolRequest(
            ref=ref("awaiting"), tool_name="pay", input=payload(), require_approval=True
        ),
        metadata=md,
    ).call
    started = b.ledger.PrepareTool(
        pb.PrepareToolRequest(
            ref=ref("started"), tool_name="pay", input=payload(), start=True
        ),
        metadata=md,
    ).call
    rejected = b.ledger.PrepareTool(
        pb.PrepareToolRequest(
            ref=ref("rejected"), tool_name="pay", input=payload(), require_approval=True
        ),
        metadata=md,
    ).call
    operator_all.ledger.DecideApproval(
        pb.DecideApprovalRequest(
            ref=ref("rejected"),
            approve=False,
            reason=f"no: {MARKER}",
            expected_revision=rejected.revision,
            input_fingerprint=rejected.input_fingerprint,
        ),
        metadata=operator_all.metadata,
    )
    b.checkpoints.Put(
        cpb.PutCheckpointRequest(
            namespace="b", key="ck", value=MARKER.encode(), expect_absent=True
        ),
        metadata=md,
    )
    return Seeded(committed, awaiting, started)


Attack = Callable[[Stubs], object]


def session_requests(s: Seeded) -> list[object]:
    """Every kind of session message, each aimed at B's records."""
    return [
        pb.PrepareToolRequest(
            ref=ref("done"), tool_name="pay", input=payload(), start=True
        ),
        pb.PrepareToolsRequest(
            calls=[pb.PrepareToolRequest(ref=ref("done"), tool_name="pay")]
        ),
        pb.StartToolRequest(ref=ref("done")),
        pb.CommitToolRequest(
            ref=ref("started"),
            attempt=s.started.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK),
        ),
        pb.ReportUnknownRequest(
            ref=ref("started"), attempt=s.started.attempt, reason="x"
        ),
        pb.HeartbeatRequest(ref=ref("started"), attempt=s.started.attempt),
        pb.GetToolCallRequest(ref=ref("done")),
    ]


def session_attack(s: Seeded) -> Attack:
    """Every kind of message on one session stream: refused as a whole
    (`SessionRefused`, the worst code first) when each message is."""

    def attack(x: Stubs) -> object:
        messages = [message(i, r) for i, r in enumerate(session_requests(s))]
        answers = list(x.ledger.Session(iter(messages), metadata=x.metadata))
        if any(a.WhichOneof("response") != "error" for a in answers):
            return [a for a in answers if a.WhichOneof("response") != "error"]
        refusals = sorted(
            (refusal(a) for a in answers), key=lambda r: r.code in ISOLATING
        )
        raise SessionRefused(refusals)

    return attack


def attacks(s: Seeded) -> dict[str, list[tuple[str, Attack]]]:
    """For each RPC, the tokens of namespace A that try it on B's data."""
    agent_only = [AGENT_A]
    readers = [AGENT_A, APPROVER_A, OPERATOR_A]

    table: dict[str, list[tuple[str, Attack]]] = {
        "/effectd.v1.ToolLedger/PrepareTool": [
            (
                t,
                lambda x: x.ledger.PrepareTool(
                    pb.PrepareToolRequest(
                        ref=ref("done"), tool_name="pay", input=payload(), start=True
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.ToolLedger/PrepareTools": [
            (
                t,
                lambda x: x.ledger.PrepareTools(
                    pb.PrepareToolsRequest(
                        calls=[
                            pb.PrepareToolRequest(
                                ref=ref("done"), tool_name="pay", input=payload()
                            )
                        ]
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.ToolLedger/StartTool": [
            (
                t,
                lambda x: x.ledger.StartTool(
                    pb.StartToolRequest(ref=ref("done")), metadata=x.metadata
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.ToolLedger/CommitTool": [
            (
                t,
                lambda x: x.ledger.CommitTool(
                    pb.CommitToolRequest(
                        ref=ref("started"),
                        attempt=s.started.attempt,
                        result=pb.ToolResult(outcome=pb.OUTCOME_OK),
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.ToolLedger/ReportUnknown": [
            (
                t,
                lambda x: x.ledger.ReportUnknown(
                    pb.ReportUnknownRequest(
                        ref=ref("started"), attempt=s.started.attempt, reason="x"
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.ToolLedger/Heartbeat": [
            (
                t,
                lambda x: x.ledger.Heartbeat(
                    pb.HeartbeatRequest(ref=ref("started"), attempt=s.started.attempt),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.ToolLedger/DecideApproval": [
            (
                t,
                lambda x: x.ledger.DecideApproval(
                    pb.DecideApprovalRequest(
                        ref=ref("awaiting"),
                        approve=True,
                        reason="yes",
                        expected_revision=s.awaiting.revision,
                        input_fingerprint=s.awaiting.input_fingerprint,
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in [APPROVER_A, AGENT_A]
        ],
        "/effectd.v1.ToolLedger/Reconcile": [
            (
                t,
                lambda x: x.ledger.Reconcile(
                    pb.ReconcileRequest(
                        ref=ref("started"),
                        expected_revision=s.started.revision,
                        not_executed=True,
                        reason="r",
                        evidence="e",
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in [OPERATOR_A, AGENT_A]
        ],
        "/effectd.v1.ToolLedger/GetToolCall": [
            (
                t,
                lambda x: x.ledger.GetToolCall(
                    pb.GetToolCallRequest(ref=ref("done")), metadata=x.metadata
                ),
            )
            for t in readers
        ],
        "/effectd.v1.ToolLedger/Session": [
            (t, session_attack(s)) for t in [AGENT_A, APPROVER_A, OPERATOR_A]
        ],
        "/effectd.v1.ToolLedger/ListToolCalls": [
            (
                t,
                lambda x: x.ledger.ListToolCalls(
                    pb.ListToolCallsRequest(namespace="b"), metadata=x.metadata
                ),
            )
            for t in readers
        ],
        "/effectd.v1.Recovery/Recover": [
            (
                t,
                lambda x: x.recovery.Recover(
                    recovery_pb2.RecoverRequest(namespace="b", run_id=RUN),
                    metadata=x.metadata,
                ),
            )
            for t in [AGENT_A, OPERATOR_A]
        ],
        "/effectd.v1.Recovery/AcknowledgeRecovery": [
            (
                t,
                lambda x: x.recovery.AcknowledgeRecovery(
                    recovery_pb2.AcknowledgeRecoveryRequest(
                        namespace="b", run_id=RUN, call_ids=["done"]
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.RetryPolicy/DecideRetry": [
            (
                t,
                lambda x: x.retry.DecideRetry(
                    retry_pb2.DecideRetryRequest(
                        call=ref("started"), context=retry_pb2.RETRY_CONTEXT_TOOL
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.Checkpoints/Get": [
            (
                t,
                lambda x: x.checkpoints.Get(
                    cpb.GetCheckpointRequest(namespace="b", key="ck"),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.Checkpoints/Put": [
            (
                t,
                lambda x: x.checkpoints.Put(
                    cpb.PutCheckpointRequest(
                        namespace="b", key="ck", value=b"evil", expected_revision=1
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.Checkpoints/Delete": [
            (
                t,
                lambda x: x.checkpoints.Delete(
                    cpb.DeleteCheckpointRequest(namespace="b", key="ck"),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.Checkpoints/Txn": [
            (
                t,
                lambda x: x.checkpoints.Txn(
                    cpb.CheckpointTxnRequest(
                        namespace="b",
                        compares=[cpb.Compare(key="ck", absent=False)],
                        ops=[cpb.TxnOp(delete=cpb.TxnDelete(key="ck"))],
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.Checkpoints/List": [
            (
                t,
                lambda x: x.checkpoints.List(
                    cpb.ListCheckpointsRequest(namespace="b"), metadata=x.metadata
                ),
            )
            for t in agent_only
        ],
        "/effectd.v1.Admin/ListAudit": [
            (
                OPERATOR_A,
                lambda x: x.admin.ListAudit(
                    admin_pb2.ListAuditRequest(namespace="b"), metadata=x.metadata
                ),
            )
        ],
        "/effectd.v1.Admin/GetStats": [
            (
                OPERATOR_A,
                lambda x: x.admin.GetStats(
                    admin_pb2.GetStatsRequest(namespace="b"), metadata=x.metadata
                ),
            )
        ],
        "/effectd.v1.Admin/EnterReconciliation": [
            (
                t,
                lambda x: x.admin.EnterReconciliation(
                    admin_pb2.EnterReconciliationRequest(
                        tool_name="pay", namespace="b", reason="dup"
                    ),
                    metadata=x.metadata,
                ),
            )
            for t in [OPERATOR_A, AGENT_A]
        ],
        "/effectd.v1.Admin/VerifyAudit": [
            (
                OPERATOR_A,
                lambda x: x.admin.VerifyAudit(
                    admin_pb2.VerifyAuditRequest(), metadata=x.metadata
                ),
            )
        ],
        "/effectd.v1.Admin/ReloadPolicy": [
            (
                OPERATOR_A,
                lambda x: x.admin.ReloadPolicy(
                    admin_pb2.ReloadPolicyRequest(reason="r"), metadata=x.metadata
                ),
            )
        ],
        "/effectd.v1.Admin/Backup": [
            (
                OPERATOR_A,
                lambda x: x.admin.Backup(
                    admin_pb2.BackupRequest(path="/nonexistent/effectd-backup"),
                    metadata=x.metadata,
                ),
            )
        ],
        # Registrations count the started calls of every namespace.
        "/effectd.v1.Admin/ListDaemons": [
            (
                t,
                lambda x: x.admin.ListDaemons(
                    admin_pb2.ListDaemonsRequest(), metadata=x.metadata
                ),
            )
            for t in [OPERATOR_A, AGENT_A, APPROVER_A]
        ],
    }
    return table


def snapshot(b: Stubs) -> list[bytes]:
    """Everything of B, as B sees it (history included)."""
    calls = b.ledger.ListToolCalls(
        pb.ListToolCallsRequest(namespace="b"), metadata=b.metadata
    ).calls
    full = [
        b.ledger.GetToolCall(
            pb.GetToolCallRequest(ref=c.ref), metadata=b.metadata
        ).call.SerializeToString(deterministic=True)
        for c in calls
    ]
    checkpoints = b.checkpoints.List(
        cpb.ListCheckpointsRequest(namespace="b"), metadata=b.metadata
    )
    return [*full, checkpoints.SerializeToString(deterministic=True)]


def run_matrix(channel: grpc.Channel) -> list[str]:
    """Tries every attack; returns what leaked or was let through."""
    b = stubs(channel, AGENT_B)
    seeded = seed(b, stubs(channel, OPERATOR_ALL))
    before = snapshot(b)
    problems = []
    for method, tries in attacks(seeded).items():
        for token, attack in tries:
            try:
                answer = attack(stubs(channel, token))
            except grpc.RpcError as exc:
                code = exc.code()
                text = str(exc.details())
                if code not in ISOLATING:
                    problems.append(f"{method}: {code.name} {text}")
                if MARKER in text:
                    problems.append(f"{method}: the refusal quotes B's data")
                continue
            problems.append(f"{method}: answered {str(answer)[:120]!r}")
    if snapshot(b) != before:
        problems.append("B's records changed")
    return problems


def test_every_rpc_is_in_the_matrix() -> None:
    """The matrix names every RPC of every service (a new RPC must get a
    row), except the Provider's, which reach no namespace."""
    every = {f"/{s.full_name}/{m.name}" for s in SERVICES for m in s.methods}
    assert every - NOT_NAMESPACED == set(attacks(_placeholder()))


def _placeholder() -> Seeded:
    return Seeded(pb.ToolCall(), pb.ToolCall(), pb.ToolCall())


def test_namespace_a_reaches_nothing_of_namespace_b(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        assert run_matrix(channel) == []


def test_the_same_requests_reach_b_with_bs_own_token(short_tmp: Path) -> None:
    """Positive control: the attacks address B's real records, so their
    NOT_FOUND comes from isolation. With B's token (or an operator of every
    namespace) the reads return B's data."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        b = stubs(channel, AGENT_B)
        everyone = stubs(channel, OPERATOR_ALL)
        seeded = seed(b, everyone)
        table = attacks(seeded)
        for method in (
            "/effectd.v1.ToolLedger/GetToolCall",
            "/effectd.v1.ToolLedger/ListToolCalls",
            "/effectd.v1.Checkpoints/Get",
            "/effectd.v1.Checkpoints/List",
            "/effectd.v1.Recovery/Recover",
        ):
            answer = table[method][0][1](b)
            assert MARKER in str(answer) or MARKER.encode() in repr(answer).encode()
        audit = table["/effectd.v1.Admin/ListAudit"][0][1](everyone)
        assert MARKER in str(audit)


def test_a_guard_that_trusts_the_request_body_is_caught(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: if the namespace came from the request body, the
    matrix would find B's data."""

    def trusting(self: access.Principal, requested: str) -> str:
        return requested or next(iter(self.namespaces))

    monkeypatch.setattr(access.Principal, "namespace", trusting)
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        problems = run_matrix(channel)
    assert any("GetToolCall: answered" in p for p in problems)
    assert "B's records changed" in problems


def test_operator_of_one_namespace_sees_only_its_stats(short_tmp: Path) -> None:
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        seed(stubs(channel, AGENT_B), stubs(channel, OPERATOR_ALL))
        a = stubs(channel, OPERATOR_A)
        mine = a.admin.GetStats(admin_pb2.GetStatsRequest(), metadata=a.metadata)
        assert [n.namespace for n in mine.namespaces] == ["a"]
        assert mine.namespaces[0].open_calls == 0
        everyone = stubs(channel, OPERATOR_ALL)
        whole = everyone.admin.GetStats(
            admin_pb2.GetStatsRequest(), metadata=everyone.metadata
        )
        b = next(n for n in whole.namespaces if n.namespace == "b")
        assert (b.awaiting_approval, b.started, b.open_calls) == (1, 1, 2)


def test_operator_of_one_namespace_lists_only_its_audit(short_tmp: Path) -> None:
    """ListAudit without a namespace: the whole log for an operator of every
    namespace, only its own namespace's entries for the operator of A."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        seed(stubs(channel, AGENT_B), stubs(channel, OPERATOR_ALL))
        a = stubs(channel, OPERATOR_A)
        mine = a.admin.ListAudit(admin_pb2.ListAuditRequest(), metadata=a.metadata)
        assert all(e.ref.namespace == "a" for e in mine.entries)
        assert MARKER not in str(mine)
        everyone = stubs(channel, OPERATOR_ALL)
        whole = everyone.admin.ListAudit(
            admin_pb2.ListAuditRequest(), metadata=everyone.metadata
        )
        assert any(e.ref.namespace == "b" for e in whole.entries)


# -- listing every namespace the token may see ---------------------------------


def _list_all(
    x: Stubs, page_size: int = 1, page_token: str = ""
) -> tuple[list[pb.ToolCall], list[str], list[str]]:
    """ListToolCalls over every namespace the token may see, page by page:
    the calls, the namespaces searched and the page tokens handed out."""
    calls: list[pb.ToolCall] = []
    searched: set[str] = set()
    tokens: list[str] = []
    while True:
        page = x.ledger.ListToolCalls(
            pb.ListToolCallsRequest(
                all_namespaces=True, page_size=page_size, page_token=page_token
            ),
            metadata=x.metadata,
        )
        calls.extend(page.calls)
        searched.update(page.searched_namespaces)
        page_token = page.next_page_token
        if not page_token:
            return calls, sorted(searched), tokens
        tokens.append(page_token)


def listing_leaks(channel: grpc.Channel) -> list[str]:
    """Every token of A lists every namespace it may see, page by page, and
    then follows page tokens of a listing that covered B; returns what
    leaked."""
    seed(stubs(channel, AGENT_B), stubs(channel, OPERATOR_ALL))
    a = stubs(channel, AGENT_A)
    a.ledger.PrepareTool(
        pb.PrepareToolRequest(ref=ref("mine", "a"), tool_name="pay", input=payload()),
        metadata=a.metadata,
    )
    _, _, tokens = _list_all(stubs(channel, OPERATOR_ALL))
    into_b = [t for t in tokens if base64.urlsafe_b64decode(t).startswith(b"b\0")]
    assert into_b, "the operator of every namespace paged through B"
    problems = []
    for token in (AGENT_A, APPROVER_A, OPERATOR_A):
        x = stubs(channel, token)
        calls, searched, _ = _list_all(x)
        if searched != ["a"]:
            problems.append(f"searched {searched}")
        if any(c.ref.namespace != "a" for c in calls) or MARKER in str(calls):
            problems.append("listed a call of B")
        for page_token in into_b:
            try:
                leaked, _, _ = _list_all(x, page_token=page_token)
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.INVALID_ARGUMENT:
                    problems.append(f"B's page token: {exc.code().name}")
                continue
            problems.append(f"followed B's page token to {len(leaked)} calls")
    return problems


def test_a_listing_of_every_namespace_holds_only_the_tokens_namespaces(
    short_tmp: Path,
) -> None:
    """ListToolCalls with all_namespaces lists, for each token of A, A's
    calls only and says it searched A; a page token that points into B is
    refused (issue 10 item 30: fails before the fix: the request had no
    all_namespaces)."""
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        assert listing_leaks(channel) == []
        both = stubs(channel, AGENT_AB)
        calls, searched, _ = _list_all(both, page_size=100)
        assert searched == ["a", "b"]
        assert {c.ref.namespace for c in calls} == {"a", "b"}
        everyone = stubs(channel, OPERATOR_ALL)
        calls, searched, _ = _list_all(everyone, page_size=100)
        assert searched == ["a", "b"]
        assert MARKER in str(calls)


@pytest.mark.parametrize("broken", ["scope", "page-token"])
def test_a_listing_that_ignores_the_grants_is_caught(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """Negative controls: a listing scoped to every namespace whatever the
    token, or a page token followed into a namespace outside the grants, is
    found by `listing_leaks`."""
    if broken == "scope":
        monkeypatch.setattr(Caller, "visible", property(lambda _: None))
        expected = "listed a call of B"
    else:
        honest = paging.decode_across

        def careless(
            token: str, prefix_of: Callable[[str], bytes], scope: object
        ) -> tuple[str, bytes] | None:
            return honest(token, prefix_of, None)

        monkeypatch.setattr(paging, "decode_across", careless)
        expected = "followed B's page token"
    with authenticated_daemon(short_tmp / "data") as (_, channel):
        problems = listing_leaks(channel)
    assert any(p.startswith(expected) for p in problems), problems
