"""The `effectd.v1.Admin` service: translation only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from effectd.v1 import admin_pb2 as pb
from effectd.v1 import ledger_pb2

from sidecar.errors import BackupTargetError, NoPolicyFile, NotImplementedYet
from sidecar.ledger import policy_change
from sidecar.ledger.audit import Action, Entry
from sidecar.ledger.model import State
from sidecar.ledger.ownership import Standing
from sidecar.ledger.policy import Policy
from sidecar.ledger.quota import DiskSpace, Quotas, StoreFill
from sidecar.ledger.restore import Marker
from sidecar.ledger.validation import Violations
from sidecar.rpc import caller, convert, operator_orders
from sidecar.services.membership import Member, MembershipService
from sidecar.services.operator import OperatorService
from sidecar.services.policy import PolicyService

Context = grpc.aio.ServicerContext[Any, Any]

ACTION_TO_PB = {a: pb.AuditAction.Value(f"AUDIT_ACTION_{a.name}") for a in Action}
STANDING_TO_PB = {
    s: pb.DaemonStanding.Value(f"DAEMON_STANDING_{s.name}") for s in Standing
}


def policy_pb(policy: Policy) -> pb.PolicySummary:
    return pb.PolicySummary(
        retry_safe=policy.retry_safe_enabled,
        max_attempts=policy.max_attempts,
        default_lease_ms=policy.default_lease_ms,
        retention_seconds=policy.retention_seconds,
        forced_side_effect_tools=policy_change.forced_side_effects(policy),
        unacknowledged_retention_seconds=policy.unacknowledged_retention_seconds,
        tombstone_seconds=policy.tombstone_seconds,
        reconcile_quarantine_leases=policy.reconcile_quarantine_leases,
        require_idempotency_proof=policy.idempotency_proof_required,
        proven_idempotent_tools=sorted(policy.proven_idempotent_tools),
        keep_inputs=policy.keep_inputs,
        max_kept_input_bytes=policy.max_kept_input_bytes,
    )


def restored_pb(marker: Marker | None) -> pb.RestoreInfo | None:
    if marker is None:
        return None
    return pb.RestoreInfo(
        restored_at=convert.timestamp(marker.at_ns),
        actor=marker.actor,
        reason=marker.reason,
        backup=marker.backup,
        backup_incarnation=marker.backup_incarnation,
        made_unknown=marker.made_unknown,
        restores=marker.count,
        audit_sequence=marker.audit_sequence,
    )


def member_pb(member: Member, *, answering: int) -> pb.DaemonRegistration:
    reg = member.registration
    return pb.DaemonRegistration(
        daemon_id=reg.daemon_id,
        incarnation=reg.incarnation,
        registered_at=convert.timestamp(reg.registered_ns),
        renewed_at=convert.timestamp(reg.vouched_ns),
        expires_at=convert.timestamp(reg.expires_ns),
        ended_at=convert.timestamp(reg.ended_ns) if reg.ended_ns else None,
        superseded_by=reg.superseded_by,
        standing=STANDING_TO_PB[member.standing],
        started_calls=member.started_calls,
        answering=reg.incarnation == answering,
    )


def entry_pb(entry: Entry) -> pb.AuditEntry:
    f = entry.fact
    return pb.AuditEntry(
        sequence=entry.sequence,
        at=convert.timestamp(f.at_ns),
        actor=f.actor,
        action=ACTION_TO_PB[f.action],
        ref=ledger_pb2.CallRef(
            namespace=f.namespace, run_id=f.run_id, call_id=f.call_id
        ),
        revision_before=f.revision_before,
        revision_after=f.revision_after,
        state_before=ledger_pb2.CALL_STATE_UNSPECIFIED
        if f.state_before is None
        else convert.STATE_TO_PB[f.state_before],
        state_after=ledger_pb2.CALL_STATE_UNSPECIFIED
        if f.state_after is None
        else convert.STATE_TO_PB[f.state_after],
        reason=f.reason,
        evidence=f.evidence,
        details=dict(f.details),
        previous_hash=entry.previous_hash,
        hash=entry.hash,
    )


def _scope(v: Violations, who: caller.Caller, requested: str) -> str | None:
    """The namespace an operator read covers: None (every one) when none is
    named and the caller may see them all; otherwise the named one or the
    credential's (`Caller.place`)."""
    if requested or not who.whole_daemon:
        return convert.namespace(v, who, requested)
    return None


class Admin:
    def __init__(
        self,
        operator: OperatorService,
        policy: PolicyService | None = None,
        *,
        backup: Callable[[Path], int] | None = None,
        quotas: Quotas | None = None,
        incarnation: int = 0,
        fill: Callable[[], StoreFill] | None = None,
        disk: Callable[[], DiskSpace] | None = None,
        restored: Marker | None = None,
        membership: MembershipService | None = None,
    ) -> None:
        self._restored = restored
        self._membership = membership
        self._operator = operator
        self._fill = fill
        self._disk = disk
        self._quotas = quotas or Quotas()
        self._incarnation = incarnation
        self._limits = operator.limits
        self._policy = policy
        self._backup = backup

    async def VerifyAudit(
        self, req: pb.VerifyAuditRequest, _: Context
    ) -> pb.VerifyAuditResponse:
        verdict = await self._operator.verify_audit()
        return pb.VerifyAuditResponse(
            ok=verdict.ok,
            entries_checked=verdict.checked,
            first_bad_sequence=verdict.bad_sequence,
            problem=verdict.problem,
        )

    async def ListAudit(
        self, req: pb.ListAuditRequest, _: Context
    ) -> pb.ListAuditResponse:
        v = Violations()
        namespace = _scope(v, caller.current(), req.namespace)
        size = convert.page_size(v, req.page_size, self._limits)
        v.require()
        page = await self._operator.list_audit(
            namespace=namespace or "",
            newest_first=req.newest_first,
            page_size=size,
            page_token=req.page_token,
        )
        return pb.ListAuditResponse(
            entries=[entry_pb(e) for e in page.entries],
            next_page_token=page.next_page_token,
        )

    async def ReloadPolicy(
        self, req: pb.ReloadPolicyRequest, _: Context
    ) -> pb.ReloadPolicyResponse:
        v = Violations()
        v.text("reason", req.reason, self._limits.max_text_bytes)
        v.require()
        if self._policy is None:
            raise NoPolicyFile("this daemon serves no policy reloads")
        # Without authentication an RPC reload is the operator's.
        actor = caller.current().actor(policy_change.OPERATOR)
        done = await self._policy.reload(actor=actor, reason=req.reason)
        return pb.ReloadPolicyResponse(
            policy=policy_pb(done.policy),
            previous=policy_pb(done.previous),
            changed=list(done.changed),
            audit_sequence=done.entry.sequence,
            file=done.source,
        )

    async def Backup(self, req: pb.BackupRequest, _: Context) -> pb.BackupResponse:
        v = Violations()
        v.text("path", req.path, self._limits.max_text_bytes)
        path = Path(req.path)
        if not req.path:
            v.add("path", "is required")
        elif not path.is_absolute():
            v.add("path", "must be an absolute path on the daemon's machine")
        v.require()
        if self._backup is None:
            raise NotImplementedYet("this daemon's store cannot be backed up")
        try:
            # The copy reads the whole store: off the event loop.
            size = await asyncio.to_thread(self._backup, path)
        except BackupTargetError as exc:
            v.add("path", f"must be a new or empty directory: {exc}")
            v.require()
            raise
        return pb.BackupResponse(path=str(path), bytes=size)

    async def EnterReconciliation(
        self, req: pb.EnterReconciliationRequest, _: Context
    ) -> pb.EnterReconciliationResponse:
        v = Violations()
        who = caller.current()
        v.text_id("tool_name", req.tool_name, self._limits.max_id_bytes)
        namespace = _scope(v, who, req.namespace)
        operator = operator_orders.operator_action(
            v, who, self._limits, req.operator, req.reason
        )
        v.require()
        done = await self._operator.enter_reconciliation(
            tool_name=req.tool_name,
            namespace=namespace,
            operator=operator,
            reason=req.reason,
        )
        return pb.EnterReconciliationResponse(
            tool_name=done.tool_name,
            prepared=done.forced.get(State.PREPARED, 0),
            awaiting_approval=done.forced.get(State.AWAITING_APPROVAL, 0),
            started=done.forced.get(State.STARTED, 0),
            unknown=done.forced.get(State.UNKNOWN, 0),
            already_side_effect=done.already,
            examined=done.examined,
            batches=done.batches,
            first_audit_sequence=done.first_audit_sequence,
            last_audit_sequence=done.last_audit_sequence,
            skipped_unknown_key_scheme=done.skipped,
        )

    async def GetStats(
        self, req: pb.GetStatsRequest, _: Context
    ) -> pb.GetStatsResponse:
        v = Violations()
        namespace = _scope(v, caller.current(), req.namespace)
        v.require()
        q = self._quotas
        return pb.GetStatsResponse(
            namespaces=[
                pb.NamespaceStats(
                    namespace=n.namespace,
                    open_calls=n.usage.open_calls,
                    prepared=n.by_state.get(State.PREPARED, 0),
                    awaiting_approval=n.by_state.get(State.AWAITING_APPROVAL, 0),
                    started=n.by_state.get(State.STARTED, 0),
                    unknown=n.by_state.get(State.UNKNOWN, 0),
                    stored_bytes=n.usage.stored_bytes,
                    tombstone_bytes=n.usage.tombstone_bytes,
                    stored_bytes_over_quota=q.bytes_over(n.usage),
                )
                for n in await self._operator.stats(namespace)
            ],
            store_fill=self._store_fill(),
            data_directory=self._data_directory(),
            quotas=pb.NamespaceQuotas(
                open_calls=q.open_calls,
                stored_bytes=q.stored_bytes,
                requests_per_second=q.requests_per_second,
                burst=q.burst,
            ),
            incarnation=self._incarnation,
            restored=restored_pb(self._restored),
        )

    async def ListDaemons(
        self, req: pb.ListDaemonsRequest, _: Context
    ) -> pb.ListDaemonsResponse:
        if self._membership is None:
            raise NotImplementedYet("this daemon keeps no registrations")
        listing = await self._membership.listing()
        return pb.ListDaemonsResponse(
            daemons=[
                member_pb(m, answering=listing.incarnation) for m in listing.members
            ],
            incarnation=listing.incarnation,
            shared=listing.shared,
            read_at=convert.timestamp(listing.wall_ns),
        )

    def _data_directory(self) -> pb.DataDirectory | None:
        # The host's: not for a caller limited to some namespaces.
        if self._disk is None or not caller.current().whole_daemon:
            return None
        try:
            disk = self._disk()
        except OSError:
            return None
        return pb.DataDirectory(
            path=disk.path,
            holds_store=disk.holds_store,
            free_bytes=disk.free_bytes,
            total_bytes=disk.total_bytes,
        )

    def _store_fill(self) -> pb.StoreFill | None:
        # The whole store's: not for a caller limited to some namespaces.
        if self._fill is None or not caller.current().whole_daemon:
            return None
        fill = self._fill()
        return pb.StoreFill(
            used_bytes=fill.used_bytes,
            high_water_bytes=fill.high_water_bytes,
            map_size_bytes=fill.map_size_bytes,
        )
