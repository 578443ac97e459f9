"""`effectd ctl reconcile`: what the target system shows for a call whose
outcome is unknown, with the expected revision of a fresh read."""

from __future__ import annotations

import argparse

from sidecar.ctl import args as a
from sidecar.ctl.calls import print_call
from sidecar.ctl.console import OK, Console, actor


def register(cmds: a.Subparsers) -> None:
    p = a.command(
        cmds,
        "reconcile",
        reconcile,
        help="resolve a call whose outcome is unknown",
        description="Records what the target system shows for a call in UNKNOWN "
        "(or STARTED): the result it produced, or that it never executed. The "
        "expected revision comes from a fresh read.",
    )
    a.call_args(p)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--result",
        type=a.json_value,
        metavar="JSON",
        help="the call did execute: its result, as JSON",
    )
    how.add_argument(
        "--not-executed",
        action="store_true",
        help="the call never took effect: it may be started again (refused "
        "until the call has been UNKNOWN for the policy's quarantine, unless "
        "--confirm-dead-attempt)",
    )
    p.add_argument(
        "--confirm-dead-attempt",
        type=int,
        default=0,
        metavar="N",
        help="you know that attempt N (the call's attempt, see show) is dead: "
        "its process is gone and cannot still run the call; --not-executed is "
        "then accepted before the quarantine ends",
    )
    a.reason(p)
    p.add_argument(
        "--evidence",
        required=True,
        help="what was checked in the target system (kept in the audit log)",
    )
    a.actor(p)


def reconcile(con: Console, args: argparse.Namespace) -> int:
    seen = con.operator.record(args.run, args.call)
    reconciled = con.operator.reconcile(
        seen.ref.run_id,
        seen.ref.call_id,
        namespace=seen.ref.namespace,
        expected_revision=seen.revision,
        operator=actor(con, args.operator),
        reason=args.reason,
        evidence=args.evidence,
        result=args.result,
        not_executed=args.not_executed,
        confirmed_dead_attempt=args.confirm_dead_attempt,
    )
    print_call(args, reconciled)
    return OK
