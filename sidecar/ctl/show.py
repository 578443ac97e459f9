"""`effectd ctl show`: one call's full record, its kept input made safe to
read, its history and reconciliations."""

from __future__ import annotations

import argparse
import base64
import time

from effectd.v1 import ledger_pb2 as pb

from sidecar.ctl import args as a
from sidecar.ctl.calls import input_matches
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import (
    age,
    emit_json,
    enum_name,
    fields,
    printable,
    table,
    when,
)
from sidecar.ctl.states import display_state, state_name, transition_to


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
    declared = enum_name(pb.Effect.Name(call.effect), "EFFECT_")
    if call.forced_effect == pb.EFFECT_UNSPECIFIED:
        return declared
    forced = enum_name(pb.Effect.Name(call.forced_effect), "EFFECT_")
    return f"{declared}, forced to {forced} (ADR-010 R2)"


def _kept_input(call: pb.ToolCall) -> list[tuple[str, object]]:
    """The kept input as sent, control and format characters made visible
    (an agent wrote it: it must not steer the approver's terminal), and
    whether it hashes to the fingerprint the decision will be bound to."""
    if not call.HasField("kept_input"):
        return [("kept input", "not kept")]
    kept = call.kept_input
    if kept.WhichOneof("kind") == "raw":
        text = f"<{len(kept.raw)} raw bytes> base64:" + base64.b64encode(
            kept.raw
        ).decode("ascii")
    else:
        text = printable(kept.json)
    check = (
        "hashes to the input fingerprint"
        if input_matches(call)
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
        return OK
    a = call.approval
    approval = (
        "not required"
        if not call.approval_required
        else "pending"
        if not call.HasField("approval")
        else f"{'approved' if a.approved else 'rejected'} by {a.approver} at "
        f"{when(a.decided_at)} (revision {a.revision}): {a.reason}"
    )
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
            ("approval", approval),
            ("result", _result_text(call.result) if call.HasField("result") else "-"),
            ("acknowledged", "yes" if call.acknowledged else "no"),
            ("created", when(call.created_at)),
            ("updated", when(call.updated_at)),
        ]
    )
    print("\nhistory")
    table(
        ("REV", "AT", "EVENT", "FROM", "TO", "ATTEMPT", "ACTOR", "REASON"),
        [
            [
                t.revision,
                when(t.at),
                t.event,
                state_name(t.from_state),
                transition_to(t),
                t.attempt,
                t.actor,
                t.reason,
            ]
            for t in call.history
        ],
    )
    if call.reconciliations:
        print("\nreconciliations")
        table(
            ("REV", "AT", "RESOLUTION", "FROM", "OPERATOR", "REASON", "EVIDENCE"),
            [
                [
                    r.revision,
                    when(r.reconciled_at),
                    enum_name(pb.Resolution.Name(r.resolution), "RESOLUTION_"),
                    state_name(r.from_state),
                    r.operator,
                    r.reason,
                    r.evidence,
                ]
                for r in call.reconciliations
            ],
        )
    return OK
