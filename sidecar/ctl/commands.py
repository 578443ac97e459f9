"""What each `effectd ctl` subcommand does against the daemon.

Ledger and recovery commands go through the typed client; the full record of
`show` and the Admin RPCs use the generated stubs on a second channel to the
same target. Each command returns its exit code; refusals propagate as
`effectd_client.EffectdError` to the boundary in `sidecar.ctl`.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import os
import sys
from collections.abc import Callable
from typing import TypeVar

import grpc
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import admin_pb2_grpc, ledger_pb2_grpc
from effectd.v1 import ledger_pb2 as pb

from effectd_client import Client, Connection, EffectdError, State, ToolCall
from sidecar.ctl.output import emit_json, enum_name, fields, printable, table, when
from sidecar.ledger import fingerprint
from sidecar.ledger.model import Payload, PayloadKind

T = TypeVar("T")

OK = 0
AUDIT_BROKEN = 4

# Calls that wait for a human come first (DESIGN §10).
_FIRST = {State.UNKNOWN: 0, State.AWAITING_APPROVAL: 1}


class Console:
    """The daemon as the console sees it: the typed client plus raw stubs."""

    def __init__(self, connection: Connection, namespace: str, timeout: float) -> None:
        self.target = connection.target
        self.namespace = namespace
        self.timeout = timeout
        self._connection = connection
        self.client = Client(
            connection.target,
            namespace=namespace,
            timeout=timeout,
            # "" rather than None: the console already read EFFECTD_TOKEN.
            token=connection.token or "",
            root_certificates=connection.root_certificates,
            certificate_chain=connection.certificate_chain,
            private_key=connection.private_key,
            max_message_bytes=connection.max_message_bytes,
        )
        self._channel: grpc.Channel | None = None

    @property
    def authenticated(self) -> bool:
        return self._connection.token is not None

    def close(self) -> None:
        self.client.close()
        if self._channel is not None:
            self._channel.close()

    def _stub_channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = self._connection.channel()
        return self._channel

    @property
    def admin(self) -> admin_pb2_grpc.AdminStub:
        return admin_pb2_grpc.AdminStub(self._stub_channel())

    @property
    def ledger(self) -> ledger_pb2_grpc.ToolLedgerStub:
        return ledger_pb2_grpc.ToolLedgerStub(self._stub_channel())

    def call(self, method: Callable[..., T], request: object) -> T:
        try:
            return method(
                request, timeout=self.timeout, metadata=self._connection.metadata
            )
        except grpc.RpcError as exc:
            raise EffectdError.from_rpc_error(exc) from None


def _actor(con: Console, name: str | None) -> str:
    """Who the audit log records. With a token the daemon records the
    token's name (and refuses any other), so none is sent unless given."""
    if name:
        return name
    if con.authenticated:
        return ""
    return user()


def user() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):  # no passwd entry for the uid
        return "operator"


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


def _state(value: pb.CallState.ValueType) -> str:
    if value == pb.CALL_STATE_UNSPECIFIED:
        return "-"
    return enum_name(pb.CallState.Name(value), "CALL_STATE_")


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
            ("state", _state(call.state)),
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
                _state(t.from_state),
                _state(t.to_state),
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
                    _state(r.from_state),
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
        approver=_actor(con, args.approver),
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
        operator=_actor(con, args.operator),
        reason=args.reason,
        evidence=args.evidence,
        result=args.result,
        not_executed=args.not_executed,
        confirmed_dead_attempt=args.confirm_dead_attempt,
    )
    _print_call(con, args, call)
    return OK


def enter_reconciliation(con: Console, args: argparse.Namespace) -> int:
    done = con.call(
        con.admin.EnterReconciliation,
        apb.EnterReconciliationRequest(
            tool_name=args.tool,
            namespace=con.namespace,
            reason=args.reason,
            operator=_actor(con, args.operator),
        ),
    )
    if args.json:
        emit_json(done)
        return OK
    forced = done.prepared + done.awaiting_approval + done.started + done.unknown
    audit = (
        f"{done.first_audit_sequence}..{done.last_audit_sequence}" if forced else "-"
    )
    fields(
        [
            ("tool", done.tool_name),
            ("now side effects", forced),
            ("  unknown", done.unknown),
            ("  started", done.started),
            ("  awaiting", done.awaiting_approval),
            ("  prepared", done.prepared),
            ("already", done.already_side_effect),
            ("audit entries", audit),
            ("unknown scheme", done.skipped_unknown_key_scheme),
        ]
    )
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


def audit_verify(con: Console, args: argparse.Namespace) -> int:
    v = con.call(con.admin.VerifyAudit, apb.VerifyAuditRequest())
    if args.json:
        emit_json(v)
    elif v.ok:
        print(f"audit log intact: {v.entries_checked} entries verified")
    else:
        print(
            f"audit log BROKEN at entry {v.first_bad_sequence}: {v.problem} "
            f"({v.entries_checked} entries verified before it)"
        )
    return OK if v.ok else AUDIT_BROKEN


def audit_list(con: Console, args: argparse.Namespace) -> int:
    entries: list[apb.AuditEntry] = []
    token = ""
    while args.limit <= 0 or len(entries) < args.limit:
        page = con.call(
            con.admin.ListAudit,
            apb.ListAuditRequest(
                namespace=con.namespace,
                newest_first=args.newest_first,
                page_token=token,
            ),
        )
        entries.extend(page.entries)
        token = page.next_page_token
        if not token:
            break
    if args.limit > 0:
        entries = entries[: args.limit]
    if args.json:
        emit_json(entries)
        return OK
    rows = [
        [
            e.sequence,
            when(e.at),
            enum_name(apb.AuditAction.Name(e.action), "AUDIT_ACTION_"),
            e.actor,
            f"{e.ref.namespace}/{e.ref.run_id}/{e.ref.call_id}"
            if e.ref.run_id
            else "-",
            f"{_state(e.state_before)}->{_state(e.state_after)}"
            if e.ref.run_id
            else "-",
            e.reason,
        ]
        for e in entries
    ]
    if rows:
        table(("SEQ", "AT", "ACTION", "ACTOR", "CALL", "STATES", "REASON"), rows)
    else:
        print("no audit entries")
    return OK


def backup(con: Console, args: argparse.Namespace) -> int:
    # The daemon resolves nothing: send it an absolute path.
    path = os.path.abspath(args.path)
    done = con.call(con.admin.Backup, apb.BackupRequest(path=path))
    if args.json:
        emit_json(done)
    else:
        # `ctl restore` only reads the backup and marks its copy; a daemon
        # started on the backup itself would change it and mark nothing.
        print(
            f"backed up {done.bytes} bytes to {done.path}\n"
            "restore (offline, the daemon stopped): "
            f"effectd ctl restore {done.path} --data-dir DIR"
        )
    return OK


def policy_reload(con: Console, args: argparse.Namespace) -> int:
    done = con.call(con.admin.ReloadPolicy, apb.ReloadPolicyRequest(reason=args.reason))
    if args.json:
        emit_json(done)
        return OK
    p = done.policy
    fields(
        [
            ("file", done.file),
            ("audit entry", done.audit_sequence),
            ("changed", ", ".join(done.changed) or "nothing"),
            ("retry_safe", "on" if p.retry_safe else "off"),
            ("max_attempts", p.max_attempts),
            ("default_lease_ms", p.default_lease_ms),
            ("retention_seconds", p.retention_seconds),
            ("unacknowledged_retention_seconds", p.unacknowledged_retention_seconds),
            ("tombstone_seconds", p.tombstone_seconds),
            ("forced side effects", ", ".join(p.forced_side_effect_tools) or "-"),
            (
                "kept inputs",
                ("every call" if p.keep_inputs else "calls awaiting approval")
                + f" (policy cap {p.max_kept_input_bytes} bytes)",
            ),
        ]
    )
    return OK


def _limit(value: float) -> str:
    return "unlimited" if value == 0 else f"{value:g}"


def stats(con: Console, args: argparse.Namespace) -> int:
    done = con.call(con.admin.GetStats, apb.GetStatsRequest(namespace=con.namespace))
    if args.json:
        emit_json(done)
        return OK
    rows = [
        [
            n.namespace,
            n.open_calls,
            n.prepared,
            n.awaiting_approval,
            n.started,
            n.unknown,
            n.stored_bytes,
            n.tombstone_bytes,
        ]
        for n in done.namespaces
    ]
    if rows:
        table(
            (
                "NAMESPACE",
                "OPEN",
                "PREPARED",
                "AWAITING",
                "STARTED",
                "UNKNOWN",
                "BYTES",
                "TOMBSTONE BYTES",
            ),
            rows,
        )
    else:
        print("no namespace holds anything")
    q = done.quotas
    print(
        f"\nquotas per namespace: open calls {_limit(q.open_calls)}, stored bytes "
        f"{_limit(q.stored_bytes)}, requests/s {_limit(q.requests_per_second)}"
        f"; incarnation {done.incarnation}"
    )
    if done.HasField("store_fill"):
        fill = done.store_fill
        share = fill.used_bytes / fill.map_size_bytes if fill.map_size_bytes else 0.0
        print(
            f"store: {fill.used_bytes} of {fill.map_size_bytes} bytes used "
            f"({share:.1%}); the data file reaches {fill.high_water_bytes}"
        )
    if done.HasField("restored"):
        r = done.restored
        print(
            f"restored from {r.backup} at {when(r.restored_at)} by {r.actor} "
            f"(restore {r.restores}, audit entry {r.audit_sequence}): "
            f"{r.made_unknown} calls made UNKNOWN; calls recorded after that "
            "backup are unknown to this store"
        )
    return OK


Command = Callable[[Console, argparse.Namespace], int]


def command_of(args: argparse.Namespace) -> Command:
    """The function of the parsed subcommand."""
    name = args.ctl_command
    if name == "audit":
        return audit_verify if args.audit_command == "verify" else audit_list
    if name == "policy":
        return policy_reload
    return {
        "list": list_calls,
        "show": show,
        "approve": decide,
        "reject": decide,
        "reconcile": reconcile,
        "enter-reconciliation": enter_reconciliation,
        "recover": recover,
        "backup": backup,
        "stats": stats,
    }[name]
