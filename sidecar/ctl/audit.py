"""`effectd ctl audit verify` and `effectd ctl audit list`: the hash-chained
audit log, walked and listed."""

from __future__ import annotations

import argparse

from effectd.v1 import admin_pb2 as apb

from sidecar.ctl import args as a
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import emit_json, enum_name, table, when
from sidecar.ctl.states import audit_after, state_name

AUDIT_BROKEN = 4


def register(cmds: a.Subparsers) -> None:
    p = cmds.add_parser("audit", help="the hash-chained audit log")
    audit = p.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    a.command(
        audit, "verify", audit_verify, help="walk the chain (exit 4 if it is broken)"
    )
    listing = a.command(audit, "list", audit_list, help="list audit entries")
    listing.add_argument("--newest-first", action="store_true", help="newest first")
    listing.add_argument(
        "--limit",
        type=int,
        default=100,
        metavar="N",
        help="at most N entries, 0 for all (default %(default)s)",
    )


def audit_verify(con: Console, args: argparse.Namespace) -> int:
    v = con.admin.verify_audit()
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
    entries = con.admin.audit_entries(
        newest_first=args.newest_first, limit=max(0, args.limit)
    )
    if args.json:
        emit_json({"entries": entries})
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
            f"{state_name(e.state_before)}->{audit_after(e)}" if e.ref.run_id else "-",
            e.reason,
        ]
        for e in entries
    ]
    if rows:
        table(("SEQ", "AT", "ACTION", "ACTOR", "CALL", "STATES", "REASON"), rows)
    else:
        print("no audit entries")
    return OK
