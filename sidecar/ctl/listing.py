"""`effectd ctl list`: the calls, those that need a human first, a page at
a time.

The daemon lists calls in key order, a page per request (`ListToolCalls`
page tokens). To put the calls that wait for a person first, the listing
reads in passes: UNKNOWN, then AWAITING_APPROVAL, then the other states
asked for. It stops after `--limit` calls and prints a page token that
resumes it exactly there: the pass, the daemon's token of the page, and the
call's place in it. `--tool` and `--older-than` are applied here, on the
pages read, since the request has no such filters.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

from effectd.v1 import ledger_pb2 as pb

from effectd_client import State
from sidecar.ctl import args as a
from sidecar.ctl.calls import CALL_HEADERS, call_row
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import age, emit_json, table

DEFAULT_LIMIT = 50
# Calls per request; the same on every page of one listing, so that a
# place within a page means the same call when the listing resumes.
PAGE_SIZE = 100
# Calls that wait for a human come first (contract §10.8), each state a pass.
_FIRST = (State.UNKNOWN, State.AWAITING_APPROVAL)
_STATES = (*_FIRST, State.PREPARED, State.STARTED)
_ALL = (*_STATES, State.COMMITTED)
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a listing resumes: the pass, the daemon's token of the page
    ("" for the pass's first), and the place of the next call in it."""

    stage: int = 0
    token: str = ""
    offset: int = 0

    def text(self) -> str:
        raw = json.dumps([self.stage, self.token, self.offset]).encode()
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def cursor(text: str) -> Cursor:
    """A `--page-token` as printed by a previous listing."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        stage, token, offset = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            "not a page token of `effectd ctl list`"
        ) from None
    if not (
        isinstance(stage, int)
        and isinstance(token, str)
        and isinstance(offset, int)
        and 0 <= stage < len(_ALL)
        and 0 <= offset < PAGE_SIZE
    ):
        raise argparse.ArgumentTypeError("not a page token of `effectd ctl list`")
    return Cursor(stage, token, offset)


def duration(text: str) -> int:
    """`90s`, `15m`, `2h`, `7d` or a sum such as `1d12h`, in seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (e.g. 90s, 15m, 2h, 7d, 1d12h)"
        )
    return sum(int(n) * _UNIT[u] for n, u in parts)


def _limit(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def register(cmds: a.Subparsers) -> None:
    p = a.command(
        cmds,
        "list",
        list_calls,
        help="list calls, those that need a human first",
        description="Lists tool calls: UNKNOWN (to reconcile) and "
        "AWAITING_APPROVAL first, then the rest, at most --limit of them; "
        "when there are more, it prints the --page-token that lists the next "
        "ones. Without --namespace, of every namespace you may see (without "
        "authentication, all of them; with a token, its namespaces), and says "
        "which were searched. AGE is the time since the call was prepared.",
    )
    p.add_argument("--run", default="", help="only calls of this run")
    p.add_argument(
        "--state",
        type=a.state,
        action="append",
        default=[],
        help="only calls in this state (repeatable)",
    )
    p.add_argument("--tool", default="", help="only calls of this tool (exact name)")
    p.add_argument(
        "--older-than",
        type=duration,
        default=0,
        metavar="AGE",
        help="only calls prepared at least AGE ago: 90s, 15m, 2h, 7d, 1d12h",
    )
    p.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help="at most N calls, 0 for all (default %(default)s)",
    )
    p.add_argument(
        "--page-token",
        type=cursor,
        default=Cursor(),
        metavar="TOKEN",
        help="go on where a listing with the same options stopped",
    )
    p.add_argument(
        "--namespace",
        dest="list_namespace",
        default=None,
        help="only this namespace (same as the global --namespace; default: "
        "every namespace you may see)",
    )


def _stages(args: argparse.Namespace) -> list[tuple[State, ...]]:
    """The states each pass lists: one pass for each state that waits for a
    person, then one for the others asked for."""
    asked = set(args.state) or set(_ALL)
    rest = tuple(s for s in _ALL if s in asked and s not in _FIRST)
    return [(s,) for s in _FIRST if s in asked] + ([rest] if rest else [])


@dataclass(slots=True)
class _Listing:
    calls: list[pb.ToolCall]
    searched: list[str]
    more: Cursor | None


def _pages(
    con: Console,
    args: argparse.Namespace,
    namespace: str | None,
    states: tuple[State, ...],
    *,
    token: str,
    searched: dict[str, None],
) -> Iterator[tuple[str, pb.ListToolCallsResponse]]:
    """The pages of one pass from `token` on, each with its own token."""
    while True:
        page = con.operator.list_page(
            states=states,
            run_id=args.run,
            namespace=namespace or "",
            all_namespaces=namespace is None,
            page_size=PAGE_SIZE,
            page_token=token,
        )
        searched.update(dict.fromkeys(page.searched_namespaces))
        yield token, page
        token = page.next_page_token
        if not token:
            return


def _read(
    con: Console, args: argparse.Namespace, namespace: str | None, now_ns: int
) -> _Listing:
    """The calls of the page asked for, and where the next page starts."""
    found: list[pb.ToolCall] = []
    searched: dict[str, None] = {}
    start: Cursor = args.page_token
    oldest = now_ns - args.older_than * 1_000_000_000
    for stage, states in enumerate(_stages(args)):
        if stage < start.stage:
            continue
        first = stage == start.stage
        pages = _pages(
            con,
            args,
            namespace,
            states,
            token=start.token if first else "",
            searched=searched,
        )
        for token, page in pages:
            offset = start.offset if first and token == start.token else 0
            for i in range(offset, len(page.calls)):
                c = page.calls[i]
                if (args.tool and c.tool_name != args.tool) or (
                    args.older_than and c.created_at.ToNanoseconds() > oldest
                ):
                    continue
                if args.limit and len(found) == args.limit:
                    return _Listing(found, sorted(searched), Cursor(stage, token, i))
                found.append(c)
    return _Listing(found, sorted(searched), None)


def list_calls(con: Console, args: argparse.Namespace) -> int:
    # No namespace named: every one the operator may see, so that no call
    # waiting for a person hides in a namespace nobody thought to ask about.
    named = args.list_namespace if args.list_namespace is not None else args.namespace
    now_ns = time.time_ns()
    done = _read(con, args, named or None, now_ns)
    more = done.more.text() if done.more is not None else None
    if args.json:
        emit_json(
            {
                "calls": done.calls,
                "next_page_token": more,
                "searched_namespaces": [named] if named else done.searched,
            }
        )
        return OK
    where = (
        f"namespace {named}"
        if named
        else f"namespaces {', '.join(done.searched)}"
        if done.searched
        else "every namespace (the store holds none yet)"
    )
    if not done.calls:
        print(f"no calls in {where}")
        return OK
    table(
        ("NAMESPACE", *CALL_HEADERS, "AGE"),
        [
            [c.ref.namespace, *call_row(c), age(now_ns - c.created_at.ToNanoseconds())]
            for c in done.calls
        ],
    )
    count = f"{len(done.calls)} call" + ("" if len(done.calls) == 1 else "s")
    print(f"\n{count} in {where}")
    if more is not None:
        print(f"more: the same command with --page-token {more}")
    return OK
