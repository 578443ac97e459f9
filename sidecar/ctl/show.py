"""`effectd ctl show`: one call's full record, its kept input made safe to
read, its history and reconciliations."""

from __future__ import annotations

import argparse
import base64
import time
from collections.abc import Iterable, Sequence
from typing import TypeVar

from effectd.v1 import ledger_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.ctl import args as a
from sidecar.ctl import record
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import (
    age,
    emit_json,
    fields,
    printable,
    table,
    when,
)
from sidecar.ctl.states import display_state

T = TypeVar("T")


def register(cmds: a.Subparsers) -> None:
    p = a.command(
        cmds, "show", show, help="one call: record, history, approval, reconciliations"
    )
    a.call_args(p)


def _result_text(r: pb.ToolResult) -> str:
    kind = r.payload.WhichOneof("kind")
    body = (
        r.payload.json
        if kind == "json"
        else f"<{len(r.payload.raw)} raw bytes>"
        if kind == "raw"
        else ""
    )
    if r.outcome == pb.OUTCOME_ERROR:
        return f"error {r.error_code}: {r.error_message} {body}".rstrip()
    return f"ok {body}".rstrip()


def _effect_text(call: pb.ToolCall) -> str:
    declared, forced = record.effect(call)
    if forced is None:
        return declared
    return f"{declared}, forced to {forced} (ADR-010 R2)"


def _kept_input(call: pb.ToolCall) -> list[tuple[str, object]]:
    """The kept input as sent, control and format characters made visible
    (an agent wrote it: it must not steer the approver's terminal), and
    whether it hashes to the fingerprint the decision will be bound to."""
    kept = record.kept_input(call)
    if kept is None:
        return [("kept input", "not kept")]
    if kept.json is None:
        text = f"<{len(kept.raw)} raw bytes> base64:" + base64.b64encode(
            kept.raw
        ).decode("ascii")
    else:
        text = printable(kept.json)
    check = (
        "hashes to the input fingerprint"
        if kept.matches
        else "DOES NOT hash to the input fingerprint: decide on the agent's "
        "own account of the input, not on this text"
    )
    return [("kept input", text), ("input check", check)]


def _quarantine(call: pb.ToolCall) -> str:
    """When --not-executed is accepted without --confirm-dead-attempt."""
    if not call.HasField("quarantine_ends_at"):
        return "-"
    left = call.quarantine_ends_at.ToNanoseconds() - time.time_ns()
    after = f"in {age(left)}" if left > 0 else "over: --not-executed is accepted"
    return f"ends {when(call.quarantine_ends_at)} ({after})"


def show(con: Console, args: argparse.Namespace) -> int:
    call = con.operator.record(args.run, args.call)
    if args.json:
        emit_json(call)
    else:
        print_record(call)
    return OK


def print_record(call: pb.ToolCall) -> None:
    """The record as `show` prints it for a person."""
    fields(
        [
            ("call", f"{call.ref.run_id} / {call.ref.call_id}"),
            ("namespace", call.ref.namespace),
            ("tool", call.tool_name),
            ("effect", _effect_text(call)),
            ("state", display_state(call)),
            ("revision", call.revision),
            ("attempt", call.attempt),
            ("lease until", when(call.lease_expires_at)),
            ("unknown from", when(call.unknown_since)),
            ("quarantine", _quarantine(call)),
            ("key", call.idempotency_key),
            ("input", call.input_fingerprint),
            *_kept_input(call),
            ("approval", record.approval(call)),
            ("result", _result_text(call.result) if call.HasField("result") else "-"),
            ("acknowledged", "yes" if call.acknowledged else "no"),
            ("created", when(call.created_at)),
            ("updated", when(call.updated_at)),
        ]
    )
    print("\nhistory")
    _table(record.HISTORY, call.history)
    if call.reconciliations:
        print("\nreconciliations")
        _table(_RECONCILIATIONS, call.reconciliations)


_RECONCILIATIONS = record.reconciliation(
    "Rev", "At", "Resolution", "From", "Operator", "Reason", "Evidence"
)


def _table(columns: Sequence[record.Column[T]], items: Iterable[T]) -> None:
    """A table of the record's, its times in UTC."""
    table(
        [c.title.upper() for c in columns],
        [
            [when(v) if isinstance(v, Timestamp) else v for v in row]
            for row in record.rows(columns, items)
        ],
    )
