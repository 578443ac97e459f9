"""The operator's surface of the client: `admin`, one method per RPC of the
Admin service, and `operator`, what a person's tools (`effectd ctl`, the web
console) read and decide through ToolLedger and Recovery; as etcd's clientv3
has Maintenance beside KV, and Temporal's service client an OperatorService
beside the workflow one. Written once, for `AsyncClient`; the synchronous
surface of `Client` (`effectd_client._operator`) is written from this module
by clients/python/unasync.py at build time.

An answer is the daemon's whole message (`effectd.v1.*_pb2`, typed by its
stub), not the agent's dataclasses: a person's tool shows every field of a
record (history, approval, reconciliations, kept input), and `effectd ctl
--json` prints each as the .proto names it. Requests are built by
`effectd_client._requests`, sent by the client's own call (its deadline,
token and wait for a daemon away), and a refusal raises the `EffectdError`
subclass of its reason, as every other call does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import admin_pb2_grpc, ledger_pb2_grpc, recovery_pb2_grpc
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb

from effectd_client import _requests as req
from effectd_client._types import Caller, State

T = TypeVar("T")


class AsyncSend(Protocol):
    """A client's call: one request with its deadline, token and reconnect
    wait, a refusal raised as an `EffectdError`."""

    async def __call__(
        self, method: Callable[..., Awaitable[T]], request: object
    ) -> T: ...


class AsyncAdmin:
    """The Admin service (contract §2.6): audit, policy, backup, stats,
    reconciliation of a tool, daemons. `namespace` None is the client's."""

    def __init__(
        self, send: AsyncSend, channel: grpc.aio.Channel, namespace: str
    ) -> None:
        self._send = send
        self._stub = admin_pb2_grpc.AdminStub(channel)
        self._namespace = namespace

    def _ns(self, namespace: str | None) -> str:
        return self._namespace if namespace is None else namespace

    async def verify_audit(self) -> apb.VerifyAuditResponse:
        """Walks the whole audit chain: intact, or its first bad entry."""
        return await self._send(self._stub.VerifyAudit, req.verify_audit())

    async def list_audit(
        self,
        *,
        namespace: str | None = None,
        newest_first: bool = False,
        page_size: int = 0,
        page_token: str = "",
    ) -> apb.ListAuditResponse:
        """One page of the audit log ("" namespace: every one you may see)."""
        request = req.list_audit(
            self._ns(namespace), newest_first, page_size, page_token
        )
        return await self._send(self._stub.ListAudit, request)

    async def audit_entries(
        self,
        *,
        namespace: str | None = None,
        newest_first: bool = False,
        limit: int = 0,
        page_size: int = 0,
    ) -> list[apb.AuditEntry]:
        """Audit entries, following page tokens: at most `limit` (0: all)."""
        entries: list[apb.AuditEntry] = []
        token = ""
        while not limit or len(entries) < limit:
            page = await self.list_audit(
                namespace=namespace,
                newest_first=newest_first,
                page_size=page_size,
                page_token=token,
            )
            entries.extend(page.entries)
            token = page.next_page_token
            if not token:
                break
        return entries[:limit] if limit else entries

    async def reload_policy(self, reason: str = "") -> apb.ReloadPolicyResponse:
        """Reads the policy file again and puts it in force, audited."""
        return await self._send(self._stub.ReloadPolicy, req.reload_policy(reason))

    async def backup(self, path: str) -> apb.BackupResponse:
        """A consistent copy of the store into `path`, an absolute path on the
        daemon's machine to a new or empty directory."""
        return await self._send(self._stub.Backup, req.backup(path))

    async def stats(self, namespace: str | None = None) -> apb.GetStatsResponse:
        """Open calls by state, bytes and quotas per namespace ("": every
        one you may see)."""
        return await self._send(self._stub.GetStats, req.get_stats(self._ns(namespace)))

    async def enter_reconciliation(
        self,
        tool_name: str,
        *,
        reason: str,
        operator: str,
        namespace: str | None = None,
    ) -> apb.EnterReconciliationResponse:
        """ADR-010 R2: every open call of `tool_name` a SIDE_EFFECT for good."""
        request = req.enter_reconciliation(
            self._ns(namespace), tool_name, reason=reason, operator=operator
        )
        return await self._send(self._stub.EnterReconciliation, request)

    async def daemons(self) -> apb.ListDaemonsResponse:
        """The daemons that share the store, as it keeps their registrations."""
        return await self._send(self._stub.ListDaemons, req.list_daemons())


class AsyncOperator:
    """A person's reads and decisions on calls, each answering the whole
    record (`effectd.v1.ToolCall`). `namespace` None is the client's."""

    def __init__(
        self,
        send: AsyncSend,
        ledger: ledger_pb2_grpc.ToolLedgerAsyncStub,
        recovery: recovery_pb2_grpc.RecoveryAsyncStub,
        namespace: str,
    ) -> None:
        self._send = send
        self._ledger = ledger
        self._recovery = recovery
        self._namespace = namespace

    def _ns(self, namespace: str | None) -> str:
        return self._namespace if namespace is None else namespace

    async def record(
        self, run_id: str, call_id: str, *, namespace: str | None = None
    ) -> pb.ToolCall:
        """The whole record of one call."""
        request = req.get_tool_call(self._ns(namespace), run_id, call_id)
        return (await self._send(self._ledger.GetToolCall, request)).call

    async def list_page(
        self,
        *,
        states: tuple[State, ...] = (),
        run_id: str = "",
        namespace: str | None = None,
        all_namespaces: bool = False,
        page_size: int = 0,
        page_token: str = "",
    ) -> pb.ListToolCallsResponse:
        """One page of calls, with the namespaces searched and the caller."""
        request = req.list_tool_calls(
            self._ns(namespace),
            run_id,
            states,
            page_size,
            page_token,
            all_namespaces=all_namespaces,
        )
        return await self._send(self._ledger.ListToolCalls, request)

    async def calls(
        self,
        *,
        states: tuple[State, ...] = (),
        run_id: str = "",
        namespace: str | None = None,
        all_namespaces: bool = False,
        limit: int = 0,
    ) -> list[pb.ToolCall]:
        """Every matching call, following page tokens: at most `limit` (0: all)."""
        found: list[pb.ToolCall] = []
        token = ""
        while not limit or len(found) < limit:
            page = await self.list_page(
                states=states,
                run_id=run_id,
                namespace=namespace,
                all_namespaces=all_namespaces,
                page_token=token,
            )
            found.extend(page.calls)
            token = page.next_page_token
            if not token:
                break
        return found[:limit] if limit else found

    async def caller(self) -> Caller:
        """Who the daemon takes this client's token for: a read every role
        may make, so it proves the credential too."""
        page = await self.list_page(all_namespaces=True, page_size=1)
        return Caller(page.caller, tuple(page.caller_roles))

    async def decide(
        self,
        run_id: str,
        call_id: str,
        *,
        approve: bool,
        approver: str,
        reason: str,
        expected_revision: int,
        input_fingerprint: str,
        namespace: str | None = None,
    ) -> pb.ToolCall:
        """Approves or rejects the call as seen at `expected_revision` with
        `input_fingerprint`: refused if it changed since. With a token the
        daemon records the token's name: `approver` "" or that name."""
        request = req.decide_approval(
            self._ns(namespace),
            run_id,
            call_id,
            approve=approve,
            approver=approver,
            reason=reason,
            expected_revision=expected_revision,
            input_fingerprint=input_fingerprint,
        )
        return (await self._send(self._ledger.DecideApproval, request)).call

    async def reconcile(
        self,
        run_id: str,
        call_id: str,
        *,
        expected_revision: int,
        operator: str,
        reason: str,
        evidence: str,
        result: Any = None,
        not_executed: bool = False,
        confirmed_dead_attempt: int = 0,
        namespace: str | None = None,
    ) -> pb.ToolCall:
        """What the target system shows: `result` found, or `not_executed`
        (refused during the quarantine unless `confirmed_dead_attempt`)."""
        request = req.reconcile(
            self._ns(namespace),
            run_id,
            call_id,
            expected_revision=expected_revision,
            operator=operator,
            reason=reason,
            evidence=evidence,
            result=result,
            not_executed=not_executed,
            confirmed_dead_attempt=confirmed_dead_attempt,
        )
        return (await self._send(self._ledger.Reconcile, request)).call

    async def recover_pages(
        self, run_id: str, *, namespace: str | None = None, page_size: int = 0
    ) -> AsyncIterator[rpb.RecoverResponse]:
        """The recovery plan of a run, page by page; it settles expired
        leases, never executes anything."""
        token = ""
        while True:
            request = req.recover(self._ns(namespace), run_id, page_size, token)
            page = await self._send(self._recovery.Recover, request)
            yield page
            token = page.next_page_token
            if not token:
                return

    async def recover(
        self, run_id: str, *, namespace: str | None = None
    ) -> rpb.RecoverResponse:
        """The whole plan of a run, its pages in one answer."""
        plan = rpb.RecoverResponse()
        async for page in self.recover_pages(run_id, namespace=namespace):
            plan.items.extend(page.items)
            plan.interrupted |= page.interrupted
            plan.settled += page.settled
        return plan
