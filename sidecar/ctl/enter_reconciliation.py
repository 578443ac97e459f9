"""`effectd ctl enter-reconciliation`: ADR-010 R2, every open call of a
tool becomes a SIDE_EFFECT for good, audited."""

from __future__ import annotations

import argparse

from sidecar.ctl import args as a
from sidecar.ctl.console import OK, Console, actor
from sidecar.ctl.output import emit_json, fields


def register(cmds: a.Subparsers) -> None:
    p = a.command(
        cmds,
        "enter-reconciliation",
        enter_reconciliation,
        help="a tool duplicated its effect: its open calls become side effects",
        description="ADR-010 R2 'enter reconciliation': every open call of TOOL "
        "(of --namespace, or of every namespace the token may see) becomes a "
        "SIDE_EFFECT for good, audited: those of unknown outcome answer "
        "RECONCILE until reconciled, whatever the policy says later, and none "
        "is retried. Force the tool in the policy file too, for new calls.",
    )
    p.add_argument("tool", metavar="TOOL", help="the tool's exact name")
    a.reason(p)
    a.actor(p)


def enter_reconciliation(con: Console, args: argparse.Namespace) -> int:
    done = con.admin.enter_reconciliation(
        args.tool, reason=args.reason, operator=actor(con, args.operator)
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
