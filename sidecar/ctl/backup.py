"""`effectd ctl backup`: a consistent copy of the store, made by the daemon
while it serves."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sidecar.ctl import args as a
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import emit_json


def register(cmds: a.Subparsers) -> None:
    p = a.command(
        cmds,
        "backup",
        backup,
        help="a consistent copy of the store, while serving",
        description="Has the daemon copy its store into PATH, a new or empty "
        "directory on the daemon's machine (its parent must exist), created "
        "0700; a relative PATH is made absolute here. Restore it with "
        "`effectd ctl restore PATH --data-dir DIR` (offline, the daemon "
        "stopped), which only reads PATH.",
    )
    p.add_argument("path", type=Path, metavar="PATH", help="the directory to write")


def backup(con: Console, args: argparse.Namespace) -> int:
    # The daemon resolves nothing: send it an absolute path.
    path = os.path.abspath(args.path)
    done = con.admin.backup(path)
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
