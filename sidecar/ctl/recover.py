"""`effectd ctl recover`: the recovery plan an agent resuming a run would
get; it never executes anything."""

from __future__ import annotations

import argparse

from effectd.v1 import recovery_pb2 as rpb

from sidecar.ctl import args as a
from sidecar.ctl.calls import effect_name
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import emit_json, enum_name, table
from sidecar.ctl.states import display_state


def register(cmds: a.Subparsers) -> None:
    p = a.command(
        cmds,
        "recover",
        recover,
        help="the recovery plan of a run",
        description="Prints what an agent resuming RUN would do with each call. "
        "Like the agent's own Recover, it turns STARTED calls whose lease expired "
        "into UNKNOWN; it never executes anything.",
    )
    p.add_argument("run", metavar="RUN", help="the run id")


def recover(con: Console, args: argparse.Namespace) -> int:
    plan = con.operator.recover(args.run)
    if args.json:
        emit_json(plan)
        return OK
    if not plan.items:
        print(f"run {args.run}: no calls")
        return OK
    table(
        ("ACTION", "CALL", "TOOL", "STATE", "EFFECT", "KEY"),
        [
            [
                enum_name(rpb.RecoveryAction.Name(i.action), "RECOVERY_ACTION_"),
                i.call.ref.call_id,
                i.call.tool_name,
                display_state(i.call),
                effect_name(i.call.effect),
                i.idempotency_key or "-",
            ]
            for i in plan.items
        ],
    )
    print(f"\ninterrupted: {'yes' if plan.interrupted else 'no'}")
    return OK
