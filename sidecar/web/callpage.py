"""One call: its exact input (pretty JSON, the fingerprint, and what an
approval is bound to), its history and attempts, its approval and
reconciliations, and the forms that decide it. Every form carries the
revision the page showed: the daemon refuses a decision made on a stale page
(REVISION_CONFLICT), and nothing is overwritten.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Sequence
from typing import TypeVar

from effectd.v1 import ledger_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp

from effectd_client import EffectdError
from sidecar.ctl import record
from sidecar.ctl.output import printable
from sidecar.ctl.states import result_example
from sidecar.web.html import (
    at,
    call_link,
    call_state,
    countdown,
    esc,
    fields,
    hidden,
    notice,
    run_link,
    table,
    waited,
)

T = TypeVar("T")

# The other calls of the run a call's page shows at most.
RUN_CALLS = 50


def refusal(exc: EffectdError) -> str:
    """What a person reads when the daemon refuses their decision."""
    if exc.reason == "REVISION_CONFLICT":
        return (
            "Someone else decided first: the call changed after this page was "
            "shown, so your decision was not applied. The page now shows the "
            "call as it is."
        )
    if exc.reason == "INPUT_MISMATCH":
        return (
            "The call's input is not the one this page showed; your decision "
            "was not applied."
        )
    if exc.code.name == "PERMISSION_DENIED":
        return (
            f"Your token may not do this: the daemon refused ({exc.message}). "
            "Nothing changed."
        )
    if exc.reason == "RECONCILE_QUARANTINE":
        return (
            f"Refused by the quarantine: {exc.message}. Nothing changed. Wait, or "
            "confirm below that the attempt's process is gone."
        )
    violations = "; ".join(f"{v.field}: {v.description}" for v in exc.violations)
    why = exc.reason or exc.code.name
    return f"Refused ({why}): {exc.message}" + (
        f" ({violations})" if violations else ""
    )


def _pretty_input(call: pb.ToolCall) -> tuple[str, str]:
    """The kept input shown, and whether it hashes to the fingerprint."""
    kept = record.kept_input(call)
    if kept is None:
        return "<p>The input is not kept for this call.</p>", ""
    if kept.json is None:
        text = f"{len(kept.raw)} raw bytes, base64:\n" + base64.b64encode(
            kept.raw
        ).decode("ascii")
    else:
        try:
            pretty = json.dumps(json.loads(kept.json), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = kept.json
        text = "\n".join(printable(line) for line in pretty.split("\n"))
    check = (
        notice("This input hashes to the fingerprint the decision is bound to.", "ok")
        if kept.matches
        else notice(
            "This input DOES NOT hash to the fingerprint: decide on the agent's "
            "own account of the input, not on this text.",
            "error",
        )
    )
    # Each line is made printable above; the line breaks are the layout.
    return f'<pre class="json" tabindex="0">{html.escape(text)}</pre>', check


def _decide_form(call: pb.ToolCall, csrf: str) -> str:
    return (
        "<h2>Decide</h2>"
        '<form method="post" action="/call/decide" class="card">'
        + _bound(call, csrf)
        + hidden("fingerprint", call.input_fingerprint)
        + f"<p>Your decision is bound to revision <b>{esc(call.revision)}</b> and "
        f"input fingerprint <code>{esc(call.input_fingerprint)}</code>: if the call "
        "changed since this page was shown, the daemon refuses it.</p>"
        '<p><label for="reason">Reason (kept in the audit log)</label>'
        '<textarea id="reason" name="reason" required rows="3"></textarea></p>'
        '<p class="buttons">'
        '<button type="submit" name="decision" value="approve">Approve</button> '
        '<button type="submit" name="decision" value="reject" class="danger">'
        "Reject</button></p></form>"
    )


def _bound(call: pb.ToolCall, csrf: str) -> str:
    return (
        hidden("csrf", csrf)
        + hidden("namespace", call.ref.namespace)
        + hidden("run", call.ref.run_id)
        + hidden("call", call.ref.call_id)
        + hidden("revision", call.revision)
    )


def _result_shape(call: pb.ToolCall) -> str:
    """What the result of a call on its channel looks like, when it matters."""
    example = result_example(call)
    if example is None:
        return ""
    return (
        "<br>An MCP call's result is an MCP CallToolResult object, e.g. "
        f"<code>{esc(example)}</code>"
    )


def _quarantine(call: pb.ToolCall, now_ns: int) -> str:
    """When "it never ran" is accepted, from the daemon's own account."""
    since = at(call.unknown_since)
    if not call.HasField("quarantine_ends_at"):
        return (
            "refused until the call has been unknown for the daemon's quarantine "
            f"(counted from {since})"
        )
    ends = call.quarantine_ends_at
    if ends.ToNanoseconds() <= now_ns:
        return f"accepted: the quarantine (counted from {since}) ended at {at(ends)}"
    return (
        f"refused until the quarantine ends at {at(ends)}, "
        f'<b class="countdown">{countdown(ends, now_ns)}</b> (counted from {since})'
    )


def _reconcile_form(call: pb.ToolCall, csrf: str, now_ns: int) -> str:
    since = at(call.unknown_since)
    return (
        "<h2>Reconcile</h2>"
        "<p>The outcome of attempt "
        f"{esc(call.attempt)} is unknown since {since}. Look in the target "
        "system, then say what you found.</p>"
        '<form method="post" action="/call/reconcile" class="card">'
        + _bound(call, csrf)
        + "<fieldset><legend>What happened</legend>"
        '<p><input type="radio" id="r-committed" name="resolution" value="committed"'
        ' required> <label for="r-committed">It ran: record the result found'
        "</label></p>"
        '<p><input type="radio" id="r-not" name="resolution" value="not_executed">'
        ' <label for="r-not">It never ran: the call may be executed again</label>'
        "</p></fieldset>"
        '<p><label for="result">Result found (JSON, when it ran)</label>'
        + _result_shape(call)
        + '<textarea id="result" name="result" rows="3" spellcheck="false"></textarea>'
        "</p>"
        '<p><label for="evidence">Evidence from the target system</label>'
        '<textarea id="evidence" name="evidence" required rows="3"></textarea></p>'
        '<p><label for="reason">Reason (kept in the audit log)</label>'
        '<textarea id="reason" name="reason" required rows="2"></textarea></p>'
        '<div class="rule"><p><b>The quarantine rule.</b> "It never ran" is '
        f"{_quarantine(call, now_ns)}: until then the attempt's process may "
        "still be running and could still execute the call. Before then, only "
        "confirm that it is dead if you know its process is gone.</p>"
        '<p><input type="checkbox" id="dead" name="confirmed_dead_attempt" '
        f'value="{esc(call.attempt)}"> <label for="dead">I know attempt '
        f"{esc(call.attempt)}'s process is gone</label></p></div>"
        '<p><button type="submit">Reconcile</button></p></form>'
    )


def _run_calls(call: pb.ToolCall, run: list[pb.ToolCall], now_ns: int) -> str:
    """The run's other calls, so that an approver sees what the run did and
    asks for besides this call."""
    others = [c for c in run if c.ref.call_id != call.ref.call_id]
    shown = others[:RUN_CALLS]
    more = (
        f'<p class="summary">The first {RUN_CALLS} are shown: the '
        f"{run_link(call.ref.namespace, call.ref.run_id, 'run page')} has "
        "them all.</p>"
        if len(others) > RUN_CALLS
        else ""
    )
    return (
        "<h2>Other calls of this run</h2>"
        + table(
            "The run's other calls, in call order",
            ("Call", "Tool", "State", "Age"),
            [
                [
                    call_link(c.ref),
                    esc(c.tool_name),
                    call_state(c),
                    waited(c.created_at, now_ns),
                ]
                for c in shown
            ],
        )
        + more
    )


def call_page(
    call: pb.ToolCall,
    csrf: str,
    message: str = "",
    kind: str = "",
    *,
    run: list[pb.ToolCall] | None = None,
    now_ns: int = 0,
) -> str:
    """The call's page; `run`: calls of its run (RUN_CALLS + 2 of them
    read at most, so that more than RUN_CALLS others can be told), shown
    beside it."""
    shown, check = _pretty_input(call)
    declared, forced = record.effect(call)
    effect = declared if forced is None else f"{declared}, forced to {forced}"
    out = notice(message, kind or "info") if message else ""
    out += fields(
        [
            ("Namespace", esc(call.ref.namespace)),
            ("Run", run_link(call.ref.namespace, call.ref.run_id)),
            ("Call", esc(call.ref.call_id)),
            ("Tool", esc(call.tool_name)),
            ("Effect", esc(effect)),
            ("State", call_state(call)),
            ("Revision", esc(call.revision)),
            ("Attempt", esc(call.attempt)),
            ("Idempotency key", f"<code>{esc(call.idempotency_key)}</code>"),
            ("Input fingerprint", f"<code>{esc(call.input_fingerprint)}</code>"),
            ("Approval", esc(record.approval(call))),
            ("Created", at(call.created_at)),
            ("Updated", at(call.updated_at)),
        ]
    )
    out += "<h2>Input</h2>" + check + shown
    if call.state == pb.CALL_STATE_AWAITING_APPROVAL:
        out += _decide_form(call, csrf)
    elif call.state == pb.CALL_STATE_UNKNOWN:
        out += _reconcile_form(call, csrf, now_ns)
    if run is not None:
        out += _run_calls(call, run, now_ns)
    out += "<h2>History</h2>" + _table(
        "Every change of the call, oldest first", record.HISTORY, call.history
    )
    attempts = sorted({t.attempt for t in call.history if t.attempt})
    out += "<h2>Attempts</h2>" + table(
        "Attempts and their last event",
        ("Attempt", "Last event", "At"),
        [
            [esc(n), esc(last.event), at(last.at)]
            for n in attempts
            for last in [[t for t in call.history if t.attempt == n][-1]]
        ],
    )
    out += "<h2>Reconciliations</h2>" + _table(
        "Reconciliations, oldest first", _RECONCILIATIONS, call.reconciliations
    )
    return out


_RECONCILIATIONS = record.reconciliation(
    "Rev", "At", "Resolution", "Attempt", "Operator", "Reason", "Evidence"
)


def _table(
    caption: str, columns: Sequence[record.Column[T]], items: Iterable[T]
) -> str:
    """A table of the record's, every cell escaped, times as the page's."""
    return table(
        caption,
        [c.title for c in columns],
        [
            [at(v) if isinstance(v, Timestamp) else esc(v) for v in row]
            for row in record.rows(columns, items)
        ],
    )
