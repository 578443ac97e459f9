"""`effectd ctl approve` and `effectd ctl reject`: a decision bound to the
revision and input fingerprint of a fresh read."""

from __future__ import annotations

import argparse

from sidecar.ctl import args as a
from sidecar.ctl.calls import print_call
from sidecar.ctl.console import OK, Console, actor


def register(cmds: a.Subparsers) -> None:
    for name in ("approve", "reject"):
        p = a.command(
            cmds,
            name,
            decide,
            help=f"{name} a call awaiting approval",
            description=f"{name.capitalize()} a call that awaits approval. The "
            "record is read first, and the decision is bound to its revision and "
            "input fingerprint: if the call changed since, the daemon refuses.",
        )
        a.call_args(p)
        a.reason(p)
        p.add_argument(
            "--approver",
            default=None,
            metavar="NAME",
            help="who decides (default $USER; with a token, the token's name)",
        )


def decide(con: Console, args: argparse.Namespace) -> int:
    seen = con.operator.record(args.run, args.call)
    decided = con.operator.decide(
        seen.ref.run_id,
        seen.ref.call_id,
        namespace=seen.ref.namespace,
        approve=args.ctl_command == "approve",
        approver=actor(con, args.approver),
        reason=args.reason,
        expected_revision=seen.revision,
        input_fingerprint=seen.input_fingerprint,
    )
    print_call(args, decided)
    return OK
