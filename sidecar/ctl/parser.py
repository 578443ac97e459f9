"""The arguments of `effectd ctl`: the global connection options, and each
command's parser, which its own module builds (`register`) together with
the function that runs it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.ctl import (
    admin,
    audit,
    backup,
    decide,
    enter_reconciliation,
    listing,
    policy,
    reconcile,
    recover,
    restore,
    show,
)
from sidecar.ctl.args import positive

if TYPE_CHECKING:
    from sidecar.ctl.args import Subparsers

DEFAULT_TIMEOUT_SECONDS = 10.0

# In the order `effectd ctl --help` lists them.
_COMMANDS = (
    listing,
    show,
    decide,
    reconcile,
    enter_reconciliation,
    recover,
    audit,
    backup,
    restore,
    admin,
    policy,
)


def default_target() -> str:
    """`unix:` the daemon's socket as `effectd serve` finds it: env
    EFFECTD_SOCKET (the container image sets it), else the socket of the
    default data directory (env EFFECTD_DATA_DIR)."""
    socket = os.environ.get("EFFECTD_SOCKET")
    if socket:
        return f"unix:{socket}"
    data_dir = Path(os.environ.get("EFFECTD_DATA_DIR", ".effectd"))
    return f"unix:{data_dir / 'effectd.sock'}"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """Adds `ctl` and its subcommands to the `effectd` subparsers."""
    ctl = sub.add_parser(
        "ctl",
        help="the operator's console: list, approve, reconcile, back up, verify",
        description="Talks to a running daemon. Exit codes: 0 ok, 1 refused by the "
        "daemon, 2 usage, 3 daemon not reachable, 4 audit verification failed, "
        "5 TLS handshake failed.",
    )
    where = ctl.add_mutually_exclusive_group()
    where.add_argument(
        "--socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="the daemon's Unix socket (default $EFFECTD_SOCKET, else "
        "$EFFECTD_DATA_DIR/effectd.sock, else .effectd/effectd.sock)",
    )
    where.add_argument(
        "--target",
        default=None,
        metavar="TARGET",
        help="a gRPC target instead: unix:PATH or 127.0.0.1:PORT",
    )
    ctl.add_argument(
        "--namespace",
        default="",
        help="the namespace of the records (default: the default namespace; "
        "list, audit list and stats: every namespace you may see)",
    )
    ctl.add_argument("--json", action="store_true", help="print JSON for scripts")
    ctl.add_argument(
        "--timeout",
        type=positive,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="deadline of each RPC (default %(default)s)",
    )
    ctl.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="a file holding the bearer token, readable by its owner only "
        "(default: $EFFECTD_TOKEN when set, else no token)",
    )
    ctl.add_argument(
        "--tls-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS: PEM roots that verify the daemon's certificate",
    )
    ctl.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS: PEM client certificate, for a daemon that requires one",
    )
    ctl.add_argument(
        "--tls-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS: PEM private key of --tls-cert",
    )
    cmds = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.register(cmds)
    return ctl
