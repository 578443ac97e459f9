"""`effectd ctl list`: the calls, those that need a human first."""

from __future__ import annotations

import argparse
import sys

from effectd.v1 import ledger_pb2 as pb

from effectd_client import State, ToolCall
from sidecar.ctl import args as a
from sidecar.ctl.calls import CALL_HEADERS, call_row
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import emit_json, table

# Calls that wait for a human come first (DESIGN §10).
_FIRST = {State.UNKNOWN: 0, State.AWAITING_APPROVAL: 1}


def register(cmds: a.Subparsers) -> None:
    p = a.command(
        cmds,
        "list",
        list_calls,
        help="list calls, those that need a human first",
        description="Lists tool calls: UNKNOWN (to reconcile) and "
        "AWAITING_APPROVAL first, then the rest. Without --namespace, of every "
        "namespace you may see (without authentication, all of them; with a "
        "token, its namespaces), and says which were searched.",
    )
    p.add_argument("--run", default="", help="only calls of this run")
    p.add_argument(
        "--state",
        type=a.state,
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


def _listing(
    con: Console, args: argparse.Namespace, namespace: str | None
) -> tuple[list[ToolCall], list[str]]:
    """Every matching call of `namespace`, or of every namespace the caller
    may see (None), and the namespaces the daemon searched."""
    calls: list[ToolCall] = []
    searched: dict[str, None] = {}
    token = ""
    while True:
        page = con.call(
            con.ledger.ListToolCalls,
            pb.ListToolCallsRequest(
                namespace=namespace or "",
                all_namespaces=namespace is None,
                run_id=args.run,
                states=[s.value for s in dict.fromkeys(args.state)],
                page_token=token,
            ),
        )
        calls.extend(ToolCall.from_pb(c) for c in page.calls)
        searched.update(dict.fromkeys(page.searched_namespaces))
        token = page.next_page_token
        if not token:
            return calls, sorted(searched)


def list_calls(con: Console, args: argparse.Namespace) -> int:
    # No namespace named: every one the operator may see, so that no call
    # waiting for a person hides in a namespace nobody thought to ask about.
    named = args.list_namespace if args.list_namespace is not None else args.namespace
    found, searched = _listing(con, args, named or None)
    calls = sorted(found, key=lambda c: _FIRST.get(c.state, len(_FIRST)))
    where = (
        f"namespace {named}"
        if named
        else f"namespaces {', '.join(searched)}"
        if searched
        else "every namespace (the store holds none yet)"
    )
    if args.json:
        emit_json(calls)
        print(f"searched {where}", file=sys.stderr)
    elif calls:
        table(
            ("NAMESPACE", *CALL_HEADERS), [[c.namespace, *call_row(c)] for c in calls]
        )
        count = f"{len(calls)} call" + ("" if len(calls) == 1 else "s")
        print(f"\n{count} in {where}")
    else:
        print(f"no calls in {where}")
    return OK
