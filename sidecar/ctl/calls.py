"""How `effectd ctl` shows tool calls in a table: the row and the headers
that `list`, `approve`, `reject` and `reconcile` print."""

from __future__ import annotations

import argparse

from effectd_client import ToolCall
from sidecar.ctl.output import emit_json, table

CALL_HEADERS = ("STATE", "RUN", "CALL", "TOOL", "EFFECT", "REV", "ATTEMPT")


def call_row(c: ToolCall) -> list[object]:
    return [
        c.state.name,
        c.run_id,
        c.call_id,
        c.tool_name,
        c.effect.name,
        c.revision,
        c.attempt,
    ]


def print_call(args: argparse.Namespace, call: ToolCall) -> None:
    """One call, as the answer to a command that changed it."""
    if args.json:
        emit_json(call)
    else:
        table(CALL_HEADERS, [call_row(call)])
