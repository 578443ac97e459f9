"""`effectd ctl policy reload`: the policy file read again, audited."""

from __future__ import annotations

import argparse

from sidecar.ctl import args as a
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import emit_json, fields


def register(cmds: a.Subparsers) -> None:
    p = cmds.add_parser("policy", help="the operator's policy")
    policy = p.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    r = a.command(
        policy, "reload", policy_reload, help="read the policy file again (audited)"
    )
    r.add_argument("--reason", default="", help="why (kept in the audit log)")


def policy_reload(con: Console, args: argparse.Namespace) -> int:
    done = con.admin.reload_policy(args.reason)
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
