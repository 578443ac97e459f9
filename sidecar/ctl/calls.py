"""The ledger commands of `effectd ctl`: list what needs a human, show a
call's full record (with its kept input made safe to read), approve or
reject, reconcile, and recover a run.
"""

from __future__ import annotations

import argparse
import base64
import sys

from effectd.v1 import ledger_pb2 as pb

from effectd_client import State, ToolCall
from sidecar.ctl.console import OK, Console, actor
from sidecar.ctl.output import (
    emit_json,
    enum_name,
    fields,
    printable,
    state_name,
    table,
    when,
)
from sidecar.ledger import fingerprint
from sidecar.ledger.model import Payload, PayloadKind

# Calls that wait for a human come first (contract §10.8).
_FIRST = {State.UNKNOWN: 0, State.AWAITING_APPROVAL: 1}


def _call_row(c: ToolCall) -> list[object]:
    return [
        c.state.name,
        c.run_id,
        c.call_id,
        c.tool_name,
        c.effect.name,
        c.revision,
        c.attempt,
    ]


_CALL_HEADERS = ("STATE", "RUN", "CALL", "TOOL", "EFFECT", "REV", "ATTEMPT")


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
            ("NAMESPACE", *_CALL_HEADERS), [[c.namespace, *_call_row(c)] for c in calls]
        )
        count = f"{len(calls)} call" + ("" if len(calls) == 1 else "s")
        print(f"\n{count} in {where}")
    else:
        print(f"no calls in {where}")
    return OK


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
        payload = Payload(PayloadKind.RAW, kept.raw)
        text = f"<{len(kept.raw)} raw bytes> base64:" + base64.b64encode(
            kept.raw
        ).decode("ascii")
    else:
        payload = Payload(PayloadKind.JSON, kept.json.encode("utf-8", "surrogatepass"))
        text = printable(kept.json)
    try:
        matches = fingerprint.fingerprint(payload) == call.input_fingerprint
    except fingerprint.NotCanonicalizable:
        matches = False
    check = (
        "hashes to the input fingerprint"
        if matches
        else "DOES NOT hash to the input fingerprint: decide on the agent's "
        "own account of the input, not on this text"
    )
    return [("kept input", text), ("input check", check)]


def show(con: Console, args: argparse.Namespace) -> int:
    ref = pb.CallRef(namespace=con.namespace, run_id=args.run, call_id=args.call)
    call = con.call(con.ledger.GetToolCall, pb.GetToolCallRequest(ref=ref)).call
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
            ("state", state_name(call.state)),
            ("revision", call.revision),
            ("attempt", call.attempt),
            ("lease until", when(call.lease_expires_at)),
            ("unknown from", when(call.unknown_since)),
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
                state_name(t.to_state),
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


def _print_call(con: Console, args: argparse.Namespace, call: ToolCall) -> None:
    if args.json:
        emit_json(call)
    else:
        table(_CALL_HEADERS, [_call_row(call)])


def decide(con: Console, args: argparse.Namespace) -> int:
    seen = con.client.get_tool_call(args.run, args.call)
    call = con.client.decide_approval(
        args.run,
        args.call,
        approve=args.ctl_command == "approve",
        approver=actor(con, args.approver),
        reason=args.reason,
        expected_revision=seen.revision,
        input_fingerprint=seen.input_fingerprint,
    )
    _print_call(con, args, call)
    return OK


def reconcile(con: Console, args: argparse.Namespace) -> int:
    seen = con.client.get_tool_call(args.run, args.call)
    call = con.client.reconcile(
        args.run,
        args.call,
        expected_revision=seen.revision,
        operator=actor(con, args.operator),
        reason=args.reason,
        evidence=args.evidence,
        result=args.result,
        not_executed=args.not_executed,
        confirmed_dead_attempt=args.confirm_dead_attempt,
    )
    _print_call(con, args, call)
    return OK


def recover(con: Console, args: argparse.Namespace) -> int:
    plan = con.client.recover(args.run)
    if args.json:
        emit_json(plan)
        return OK
    if not plan.items:
        print(f"run {args.run}: no calls")
        return OK
    table(
        ("ACTION", "CALL", "TOOL", "STATE", "EFFECT", "KEY"),
        [
            [
                i.action.name,
                i.call.call_id,
                i.call.tool_name,
                i.call.state.name,
                i.call.effect.name,
                i.idempotency_key or "-",
            ]
            for i in plan.items
        ],
    )
    print(f"\ninterrupted: {'yes' if plan.interrupted else 'no'}")
    return OK
