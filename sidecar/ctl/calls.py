"""How `effectd ctl` shows tool calls in a table: the row and the headers
that `list`, `approve`, `reject` and `reconcile` print."""

from __future__ import annotations

import argparse

from effectd.v1 import ledger_pb2 as pb

from sidecar.ctl.output import emit_json, enum_name, table
from sidecar.ctl.states import display_state

CALL_HEADERS = ("STATE", "RUN", "CALL", "TOOL", "EFFECT", "REV", "ATTEMPT")


def effect_name(value: pb.Effect.ValueType) -> str:
    return enum_name(pb.Effect.Name(value), "EFFECT_")


def call_row(c: pb.ToolCall) -> list[object]:
    return [
        display_state(c),
        c.ref.run_id,
        c.ref.call_id,
        c.tool_name,
        effect_name(c.effect),
        c.revision,
        c.attempt,
    ]


def print_call(args: argparse.Namespace, call: pb.ToolCall) -> None:
    """One call, as the answer to a command that changed it."""
    if args.json:
        emit_json(call)
    else:
        table(CALL_HEADERS, [call_row(call)])
