"""`effectd ctl restore`: a backup into a data directory, offline; or, with
`--store URL`, the marking of a PostgreSQL database restored by its own tools.

Unlike every other `ctl` command it talks to no daemon: it works on the
files, under the daemon's own lock (`sidecar.storage.lmdb.restore`), or on the
database while no daemon is registered live there
(`sidecar.storage.postgres.restore`). Exit 0 restored, 1 refused (the message says
why; the data directory holds no restored store then, the database is
unchanged), 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from effectd.v1 import admin_pb2 as apb

from sidecar.clock import SystemClock
from sidecar.ctl import args as a
from sidecar.ctl.console import user
from sidecar.ctl.output import emit_json, fields
from sidecar.ledger.restore import Marker
from sidecar.storage import backends
from sidecar.storage.lmdb.restore import restore_backup
from sidecar.storage.marking import RestoreRefused

OK = 0
REFUSED = 1

# What no restore can know, said where the operator reads the result.
UNKNOWABLE = (
    "Not in the restored store, and not knowable from it: calls recorded after the "
    "backup was taken (an agent's repeated prepare records them anew and answers "
    "EXECUTE), and the results, acknowledgements, approvals and audit entries written "
    "after it. Find those in the target systems (by idempotency key RUN:CALL) before "
    "agents resume; then reconcile the UNKNOWN calls (effectd ctl list --state "
    "unknown)."
)


def register(cmds: a.Subparsers) -> None:
    p = cmds.add_parser(
        "restore",
        help="restore a backup into a data directory, or mark a restored "
        "database, offline (audited)",
        description="Copies BACKUP into --data-dir while no daemon runs there, "
        "and marks the copy restored before it can answer anything: every call "
        "that is not COMMITTED becomes UNKNOWN (a side effect then answers "
        "RECONCILE until reconciled), and the restore is written to the audit "
        "log. Refused while a daemon serves --data-dir, when --data-dir already "
        "holds a store (move it aside), or when BACKUP is not a store. With "
        "--store URL instead, marks the PostgreSQL database at URL the same way "
        "in place, after you restored BACKUP into it with the database's own "
        "tools (BACKUP is then only named in the marker and the audit entry); "
        "refused while a daemon's registration there is live. Calls recorded "
        "after the backup was taken are not in it: nothing can tell that they "
        "ran. Talks to no daemon. Exit 0 restored, 1 refused, 2 usage.",
    )
    p.add_argument(
        "backup",
        type=Path,
        metavar="BACKUP",
        help="the backup directory (with --store: the dump or recovery point "
        "restored, as you name it)",
    )
    into = p.add_mutually_exclusive_group(required=True)
    into.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="the data directory to restore into: new, or without a store",
    )
    into.add_argument(
        "--store",
        metavar="URL",
        help="the PostgreSQL database restored from BACKUP, to mark in place",
    )
    a.reason(p)
    p.add_argument(
        "--operator",
        default=None,
        metavar="NAME",
        help="who restores (default $USER)",
    )
    a.json_flag(p)


def _restore_info(m: Marker) -> apb.RestoreInfo:
    """The marker as `ctl stats` shows it, one record in one shape."""
    info = apb.RestoreInfo(
        actor=m.actor,
        reason=m.reason,
        backup=m.backup,
        backup_incarnation=m.backup_incarnation,
        made_unknown=m.made_unknown,
        restores=m.count,
        audit_sequence=m.audit_sequence,
    )
    info.restored_at.FromNanoseconds(m.at_ns)
    return info


def run(args: argparse.Namespace) -> int:
    try:
        done = restore_backup(
            args.backup,
            args.data_dir,
            actor=args.operator or user(),
            reason=args.reason,
            clock=SystemClock(),
        )
    except RestoreRefused as exc:
        print(f"effectd ctl restore: refused: {exc}", file=sys.stderr)
        return REFUSED
    m = done.marker
    if args.json:
        emit_json(
            {
                "data_dir": str(done.data_dir),
                "bytes": done.bytes,
                "restored": _restore_info(m),
            }
        )
    else:
        fields(
            [
                ("restored", f"{m.backup} into {done.data_dir} ({done.bytes} bytes)"),
                ("made UNKNOWN", f"{m.made_unknown} calls that were not committed"),
                ("backup taken", f"under incarnation {m.backup_incarnation}"),
                ("audit entry", m.audit_sequence),
                ("restores", f"{m.count} of this store"),
            ]
        )
        print(f"\n{UNKNOWABLE}")
    return OK


def run_database(args: argparse.Namespace, *, shown: str, password: str | None) -> int:
    """`effectd ctl restore NAME --store URL` on a URL the configuration's
    rules accepted; `shown` is it masked, `password` what it must not print."""
    try:
        backend = backends.of_url(args.store)
        assert backend is not None  # validated
        m = backend.entry().mark_restored(
            args.store,
            str(args.backup),
            actor=args.operator or user(),
            reason=args.reason,
            clock=SystemClock(),
        )
    except RestoreRefused as exc:
        text = str(exc).replace(password, "***") if password else str(exc)
        print(f"effectd ctl restore: {shown}: refused: {text}", file=sys.stderr)
        return REFUSED
    if args.json:
        emit_json({"store": shown, "restored": _restore_info(m)})
        return OK
    fields(
        [
            ("marked", f"{shown}, restored from {m.backup}"),
            ("made UNKNOWN", f"{m.made_unknown} calls that were not committed"),
            ("audit entry", m.audit_sequence),
            ("restores", f"{m.count} of this store"),
        ]
    )
    print(f"\n{UNKNOWABLE}")
    return OK
