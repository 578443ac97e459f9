"""The arguments of `effectd ctl`: global connection options and one
subcommand per operator task. Only parsing lives here; `commands` acts."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from effectd_client import State

DEFAULT_TIMEOUT_SECONDS = 10.0

if TYPE_CHECKING:
    # Generic only to the type checker.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def default_target() -> str:
    """`unix:` the daemon's socket as `effectd serve` finds it: env
    EFFECTD_SOCKET (the container image sets it), else the socket of the
    default data directory (env EFFECTD_DATA_DIR)."""
    socket = os.environ.get("EFFECTD_SOCKET")
    if socket:
        return f"unix:{socket}"
    data_dir = Path(os.environ.get("EFFECTD_DATA_DIR", ".effectd"))
    return f"unix:{data_dir / 'effectd.sock'}"


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _state(text: str) -> State:
    name = text.strip().upper().replace("-", "_")
    try:
        return State[name]
    except KeyError:
        choices = ", ".join(s.name for s in State)
        raise argparse.ArgumentTypeError(
            f"unknown state {text!r} (one of {choices})"
        ) from None


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _call_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="the run id")
    p.add_argument("call", metavar="CALL", help="the call id")


def _decision(sub: Subparsers, name: str, verb: str) -> None:
    p = sub.add_parser(
        name,
        help=f"{verb} a call awaiting approval",
        description=f"{verb.capitalize()} a call that awaits approval. The record "
        "is read first, and the decision is bound to its revision and input "
        "fingerprint: if the call changed since, the daemon refuses.",
    )
    _call_args(p)
    p.add_argument("--reason", required=True, help="why (kept in the audit log)")
    p.add_argument(
        "--approver",
        default=None,
        metavar="NAME",
        help="who decides (default $USER; with a token, the token's name)",
    )


def _restore(cmds: Subparsers) -> None:
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
    p.add_argument("--reason", required=True, help="why (kept in the audit log)")
    p.add_argument(
        "--operator",
        default=None,
        metavar="NAME",
        help="who restores (default $USER)",
    )


def _store_views(cmds: Subparsers) -> None:
    """`stats` and `daemons`: what the store holds, and who serves it."""
    cmds.add_parser(
        "stats",
        help="what each namespace holds: open calls by state, bytes, quotas",
        description="Per namespace (or the one of --namespace): calls not yet "
        "committed, by state (AWAITING and UNKNOWN wait for a person), and the "
        "bytes stored, against the quotas in force.",
    )

    cmds.add_parser(
        "daemons",
        help="the daemons sharing the store: registrations, standing, calls held",
        description="Every registration the store keeps, oldest first: the "
        "daemon id, its incarnation, whether it is live, lapsed (its daemon "
        "died or lost the store), ended (a clean stop) or superseded (a "
        "restart), when it registered, last renewed and lapses unless renewed, "
        "and the STARTED calls whose lease it granted (those its lapse settles "
        "to UNKNOWN). `*` marks the daemon that answers.",
    )


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
        type=_positive,
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

    p = cmds.add_parser(
        "list",
        help="list calls, those that need a human first",
        description="Lists tool calls: UNKNOWN (to reconcile) and "
        "AWAITING_APPROVAL first, then the rest. Without --namespace, of every "
        "namespace you may see (without authentication, all of them; with a "
        "token, its namespaces), and says which were searched.",
    )
    p.add_argument("--run", default="", help="only calls of this run")
    p.add_argument(
        "--state",
        type=_state,
        action="append",
        default=[],
        help="only calls in this state (repeatable)",
    )
    p.add_argument(
        "--namespace",
        dest="list_namespace",
        default=None,
        help="only this namespace (same as the global --namespace; default: "
        "every namespace you may see)",
    )

    p = cmds.add_parser(
        "show", help="one call: record, history, approval, reconciliations"
    )
    _call_args(p)

    _decision(cmds, "approve", "approve")
    _decision(cmds, "reject", "reject")

    p = cmds.add_parser(
        "reconcile",
        help="resolve a call whose outcome is unknown",
        description="Records what the target system shows for a call in UNKNOWN "
        "(or STARTED): the result it produced, or that it never executed. The "
        "expected revision comes from a fresh read.",
    )
    _call_args(p)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--result",
        type=_json_value,
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
    p.add_argument("--reason", required=True, help="why (kept in the audit log)")
    p.add_argument(
        "--evidence",
        required=True,
        help="what was checked in the target system (kept in the audit log)",
    )
    p.add_argument(
        "--operator",
        default=None,
        metavar="NAME",
        help="who (default $USER; with a token, the token's name)",
    )

    p = cmds.add_parser(
        "enter-reconciliation",
        help="a tool duplicated its effect: its open calls become side effects",
        description="ADR-010 R2 'enter reconciliation': every open call of TOOL "
        "(of --namespace, or of every namespace the token may see) becomes a "
        "SIDE_EFFECT for good, audited: those of unknown outcome answer "
        "RECONCILE until reconciled, whatever the policy says later, and none "
        "is retried. Force the tool in the policy file too, for new calls.",
    )
    p.add_argument("tool", metavar="TOOL", help="the tool's exact name")
    p.add_argument("--reason", required=True, help="why (kept in the audit log)")
    p.add_argument(
        "--operator",
        default=None,
        metavar="NAME",
        help="who (default $USER; with a token, the token's name)",
    )

    p = cmds.add_parser(
        "recover",
        help="the recovery plan of a run",
        description="Prints what an agent resuming RUN would do with each call. "
        "Like the agent's own Recover, it turns STARTED calls whose lease expired "
        "into UNKNOWN; it never executes anything.",
    )
    p.add_argument("run", metavar="RUN", help="the run id")

    p = cmds.add_parser("audit", help="the hash-chained audit log")
    audit = p.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    audit.add_parser("verify", help="walk the chain (exit 4 if it is broken)")
    a = audit.add_parser("list", help="list audit entries")
    a.add_argument("--newest-first", action="store_true", help="newest first")
    a.add_argument(
        "--limit",
        type=int,
        default=100,
        metavar="N",
        help="at most N entries, 0 for all (default %(default)s)",
    )

    p = cmds.add_parser(
        "backup",
        help="a consistent copy of the store, while serving",
        description="Has the daemon copy its store into PATH, a new or empty "
        "directory on the daemon's machine (its parent must exist), created "
        "0700; a relative PATH is made absolute here. Restore it with "
        "`effectd ctl restore PATH --data-dir DIR` (offline, the daemon "
        "stopped), which only reads PATH.",
    )
    p.add_argument("path", type=Path, metavar="PATH", help="the directory to write")

    _restore(cmds)

    _store_views(cmds)

    p = cmds.add_parser("policy", help="the operator's policy")
    policy = p.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")
    r = policy.add_parser("reload", help="read the policy file again (audited)")
    r.add_argument("--reason", default="", help="why (kept in the audit log)")
    return ctl
