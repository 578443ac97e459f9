"""What every `effectd ctl` command's parser is made of: the subparsers
type, argument types (a state, JSON, a positive number) and the arguments
several commands share. Each command module builds its own parser with
these (`register`) and names the function that runs it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from effectd_client import State

if TYPE_CHECKING:
    # Generic only to the type checker.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
    from sidecar.ctl.console import Console

Run: TypeAlias = "Callable[[Console, argparse.Namespace], int]"


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def state(text: str) -> State:
    name = text.strip().upper().replace("-", "_")
    try:
        return State[name]
    except KeyError:
        choices = ", ".join(s.name for s in State)
        raise argparse.ArgumentTypeError(
            f"unknown state {text!r} (one of {choices})"
        ) from None


def positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def call_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="the run id")
    p.add_argument("call", metavar="CALL", help="the call id")


def reason(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", required=True, help="why (kept in the audit log)")


def actor(p: argparse.ArgumentParser, flag: str = "--operator") -> None:
    p.add_argument(
        flag,
        default=None,
        metavar="NAME",
        help="who (default $USER; with a token, the token's name)",
    )


def json_flag(p: argparse.ArgumentParser) -> None:
    """`--json` after the command too: `ctl list --json` as `ctl --json list`.
    Absent, it leaves the global flag's value as it is."""
    p.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print JSON for scripts (docs/operations.md: one shape per record)",
    )


def command(
    cmds: Subparsers, name: str, run: Run, **kwargs: Any
) -> argparse.ArgumentParser:
    """The parser of one command, which runs `run`, with `--json`."""
    p = cmds.add_parser(name, **kwargs)
    p.set_defaults(handler=run)
    json_flag(p)
    return p
