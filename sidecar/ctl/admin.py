"""The Admin commands of `effectd ctl`: put a tool's open calls into
reconciliation, verify and list the audit log, back up while serving, reload
the policy, the store's statistics, and the daemons that share the store.
"""

from __future__ import annotations

import argparse
import os

from effectd.v1 import admin_pb2 as apb

from sidecar.ctl.console import OK, Console, actor
from sidecar.ctl.output import emit_json, enum_name, fields, state_name, table, when

AUDIT_BROKEN = 4


def enter_reconciliation(con: Console, args: argparse.Namespace) -> int:
    done = con.call(
        con.admin.EnterReconciliation,
        apb.EnterReconciliationRequest(
            tool_name=args.tool,
            namespace=con.namespace,
            reason=args.reason,
            operator=actor(con, args.operator),
        ),
    )
    if args.json:
        emit_json(done)
        return OK
    forced = done.prepared + done.awaiting_approval + done.started + done.unknown
    audit = (
        f"{done.first_audit_sequence}..{done.last_audit_sequence}" if forced else "-"
    )
    fields(
        [
            ("tool", done.tool_name),
            ("now side effects", forced),
            ("  unknown", done.unknown),
            ("  started", done.started),
            ("  awaiting", done.awaiting_approval),
            ("  prepared", done.prepared),
            ("already", done.already_side_effect),
            ("audit entries", audit),
            ("unknown scheme", done.skipped_unknown_key_scheme),
        ]
    )
    return OK


def audit_verify(con: Console, args: argparse.Namespace) -> int:
    v = con.call(con.admin.VerifyAudit, apb.VerifyAuditRequest())
    if args.json:
        emit_json(v)
    elif v.ok:
        print(f"audit log intact: {v.entries_checked} entries verified")
    else:
        print(
            f"audit log BROKEN at entry {v.first_bad_sequence}: {v.problem} "
            f"({v.entries_checked} entries verified before it)"
        )
    return OK if v.ok else AUDIT_BROKEN


def audit_list(con: Console, args: argparse.Namespace) -> int:
    entries: list[apb.AuditEntry] = []
    token = ""
    while args.limit <= 0 or len(entries) < args.limit:
        page = con.call(
            con.admin.ListAudit,
            apb.ListAuditRequest(
                namespace=con.namespace,
                newest_first=args.newest_first,
                page_token=token,
            ),
        )
        entries.extend(page.entries)
        token = page.next_page_token
        if not token:
            break
    if args.limit > 0:
        entries = entries[: args.limit]
    if args.json:
        emit_json(entries)
        return OK
    rows = [
        [
            e.sequence,
            when(e.at),
            enum_name(apb.AuditAction.Name(e.action), "AUDIT_ACTION_"),
            e.actor,
            f"{e.ref.namespace}/{e.ref.run_id}/{e.ref.call_id}"
            if e.ref.run_id
            else "-",
            f"{state_name(e.state_before)}->{state_name(e.state_after)}"
            if e.ref.run_id
            else "-",
            e.reason,
        ]
        for e in entries
    ]
    if rows:
        table(("SEQ", "AT", "ACTION", "ACTOR", "CALL", "STATES", "REASON"), rows)
    else:
        print("no audit entries")
    return OK


def backup(con: Console, args: argparse.Namespace) -> int:
    # The daemon resolves nothing: send it an absolute path.
    path = os.path.abspath(args.path)
    done = con.call(con.admin.Backup, apb.BackupRequest(path=path))
    if args.json:
        emit_json(done)
    else:
        # `ctl restore` only reads the backup and marks its copy; a daemon
        # started on the backup itself would change it and mark nothing.
        print(
            f"backed up {done.bytes} bytes to {done.path}\n"
            "restore (offline, the daemon stopped): "
            f"effectd ctl restore {done.path} --data-dir DIR"
        )
    return OK


def policy_reload(con: Console, args: argparse.Namespace) -> int:
    done = con.call(con.admin.ReloadPolicy, apb.ReloadPolicyRequest(reason=args.reason))
    if args.json:
        emit_json(done)
        return OK
    p = done.policy
    fields(
        [
            ("file", done.file),
            ("audit entry", done.audit_sequence),
            ("changed", ", ".join(done.changed) or "nothing"),
            ("retry_safe", "on" if p.retry_safe else "off"),
            ("max_attempts", p.max_attempts),
            ("default_lease_ms", p.default_lease_ms),
            ("retention_seconds", p.retention_seconds),
            ("unacknowledged_retention_seconds", p.unacknowledged_retention_seconds),
            ("tombstone_seconds", p.tombstone_seconds),
            ("forced side effects", ", ".join(p.forced_side_effect_tools) or "-"),
            (
                "kept inputs",
                "every call's, until settled"
                + (
                    f", then up to {p.max_kept_input_bytes} bytes until compacted"
                    if p.keep_inputs
                    else ""
                ),
            ),
        ]
    )
    return OK


def _limit(value: float) -> str:
    return "unlimited" if value == 0 else f"{value:g}"


def stats(con: Console, args: argparse.Namespace) -> int:
    done = con.call(con.admin.GetStats, apb.GetStatsRequest(namespace=con.namespace))
    if args.json:
        emit_json(done)
        return OK
    rows = [
        [
            n.namespace,
            n.open_calls,
            n.prepared,
            n.awaiting_approval,
            n.started,
            n.unknown,
            n.stored_bytes,
            n.tombstone_bytes,
        ]
        for n in done.namespaces
    ]
    if rows:
        table(
            (
                "NAMESPACE",
                "OPEN",
                "PREPARED",
                "AWAITING",
                "STARTED",
                "UNKNOWN",
                "BYTES",
                "TOMBSTONE BYTES",
            ),
            rows,
        )
    else:
        print("no namespace holds anything")
    q = done.quotas
    print(
        f"\nquotas per namespace: open calls {_limit(q.open_calls)}, stored bytes "
        f"{_limit(q.stored_bytes)}, requests/s {_limit(q.requests_per_second)}"
        f"; incarnation {done.incarnation}"
    )
    for n in done.namespaces:
        if n.stored_bytes_over_quota:
            print(
                f"over quota: {n.namespace} stores {n.stored_bytes} bytes, "
                f"{n.stored_bytes_over_quota} past its quota: its new calls are "
                "refused (QUOTA_EXCEEDED) until retention frees them"
            )
    if done.HasField("store_fill"):
        fill = done.store_fill
        share = fill.used_bytes / fill.map_size_bytes if fill.map_size_bytes else 0.0
        print(
            f"store: {fill.used_bytes} of {fill.map_size_bytes} bytes used "
            f"({share:.1%}); the data file reaches {fill.high_water_bytes}"
        )
    if done.HasField("data_directory"):
        _print_disk(done)
    if done.HasField("restored"):
        r = done.restored
        print(
            f"restored from {r.backup} at {when(r.restored_at)} by {r.actor} "
            f"(restore {r.restores}, audit entry {r.audit_sequence}): "
            f"{r.made_unknown} calls made UNKNOWN; calls recorded after that "
            "backup are unknown to this store"
        )
    return OK


def _print_disk(done: apb.GetStatsResponse) -> None:
    disk = done.data_directory
    share = disk.free_bytes / disk.total_bytes if disk.total_bytes else 0.0
    where = (
        "it holds the store"
        if disk.holds_store
        else "the store is not on it: watch the database server's disk"
    )
    print(
        f"data directory {disk.path}: {disk.free_bytes} of {disk.total_bytes} "
        f"bytes free ({share:.1%}); {where}"
    )
    fill = done.store_fill
    room = fill.map_size_bytes - fill.high_water_bytes
    if disk.holds_store and done.HasField("store_fill") and room > disk.free_bytes:
        print(
            f"warning: the store may grow {room} more bytes but the disk has "
            f"{disk.free_bytes} free: writes fail with STORAGE_FULL when it is "
            "full; grow the volume, or set --map-size to what it holds"
        )


def daemons(con: Console, args: argparse.Namespace) -> int:
    done = con.call(con.admin.ListDaemons, apb.ListDaemonsRequest())
    if args.json:
        emit_json(done)
        return OK
    rows = [
        [
            ("* " if d.answering else "") + d.daemon_id,
            d.incarnation,
            enum_name(apb.DaemonStanding.Name(d.standing), "DAEMON_STANDING_").lower(),
            when(d.registered_at),
            when(d.renewed_at),
            when(d.expires_at),
            when(d.ended_at),
            d.started_calls,
        ]
        for d in done.daemons
    ]
    table(
        (
            "DAEMON",
            "INCARNATION",
            "STANDING",
            "REGISTERED",
            "RENEWED",
            "LEASE END",
            "ENDED",
            "STARTED CALLS",
        ),
        rows,
    )
    kind = "shared by several daemons" if done.shared else "this daemon's alone"
    print(
        f"\n* answers (incarnation {done.incarnation}); the store is {kind}; "
        f"read at {when(done.read_at)}"
    )
    return OK
