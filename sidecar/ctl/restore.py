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

from sidecar.clock import SystemClock
from sidecar.ctl.console import user
from sidecar.ctl.output import emit_json, fields
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
        emit_json({"data_dir": str(done.data_dir), "bytes": done.bytes, "marker": m})
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
        emit_json({"store": shown, "marker": m})
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
