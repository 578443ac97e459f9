"""What each `effectd ctl` subcommand does against the daemon: the function
of the parsed subcommand. The ledger commands are in `sidecar.ctl.calls`, the
Admin ones in `sidecar.ctl.admin`. Each command returns its exit code;
refusals propagate as `effectd_client.EffectdError` to the boundary in
`sidecar.ctl`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from sidecar.ctl.admin import (
    audit_list,
    audit_verify,
    backup,
    daemons,
    enter_reconciliation,
    policy_reload,
    stats,
)
from sidecar.ctl.calls import decide, list_calls, reconcile, recover, show
from sidecar.ctl.console import Console

Command = Callable[[Console, argparse.Namespace], int]


def command_of(args: argparse.Namespace) -> Command:
    """The function of the parsed subcommand."""
    name = args.ctl_command
    if name == "audit":
        return audit_verify if args.audit_command == "verify" else audit_list
    if name == "policy":
        return policy_reload
    return {
        "list": list_calls,
        "show": show,
        "approve": decide,
        "reject": decide,
        "reconcile": reconcile,
        "enter-reconciliation": enter_reconciliation,
        "recover": recover,
        "backup": backup,
        "stats": stats,
        "daemons": daemons,
    }[name]
