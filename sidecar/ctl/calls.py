"""How `effectd ctl` shows tool calls in a table: the row and the headers
that `list`, `approve`, `reject` and `reconcile` print; and whether a call's
kept input is the one its fingerprint names, which `show` and the console
say beside it."""

from __future__ import annotations

import argparse

from effectd.v1 import ledger_pb2 as pb

from sidecar.ctl.output import emit_json, enum_name, table
from sidecar.ctl.states import display_state
from sidecar.ledger import fingerprint
from sidecar.ledger.model import Payload, PayloadKind

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


def input_matches(call: pb.ToolCall) -> bool:
    """Whether the call's kept input hashes to its input fingerprint, the
    one an approval is bound to; False when no input is kept. Someone else
    wrote that copy: a person decides on it only when it matches."""
    if not call.HasField("kept_input"):
        return False
    kept = call.kept_input
    if kept.WhichOneof("kind") == "raw":
        payload = Payload(PayloadKind.RAW, kept.raw)
    else:
        payload = Payload(PayloadKind.JSON, kept.json.encode("utf-8", "surrogatepass"))
    try:
        return fingerprint.fingerprint(payload) == call.input_fingerprint
    except fingerprint.NotCanonicalizable:
        return False
