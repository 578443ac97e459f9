"""The pages besides a call's own (`sidecar.web.callpage`): sign-in, the
queue of what waits for a person, a run and its recovery plan, and the audit
log with its verification.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from effectd.v1 import admin_pb2 as apb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import recovery_pb2 as rpb
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.ctl.output import enum_name
from sidecar.ctl.states import audit_after, state_name
from sidecar.web.daemon import Preview
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


def signin(csrf: str, error: str = "", *, token_required: bool = False) -> str:
    name_help = (
        "Not used here: this console accepts only tokens."
        if token_required
        else "Only when the daemon has no tokens: the name the audit log "
        "records for your decisions. With a token, the daemon records the "
        "token's own name."
    )
    return (
        (notice(error, "error") if error else "")
        + '<form method="post" action="/signin" class="card">'
        + hidden("csrf", csrf)
        + '<p><label for="token">Your effectd token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password"'
        ' spellcheck="false" aria-describedby="token-help">'
        '<small id="token-help">The console sends it to the daemon with every '
        "request: you can do here exactly what the token may do, no more.</small></p>"
        '<p><label for="name">Your name</label>'
        '<input id="name" name="name" autocomplete="username"'
        ' aria-describedby="name-help">'
        f'<small id="name-help">{esc(name_help)}</small></p>'
        '<p><button type="submit">Sign in</button></p></form>'
    )


def _input(found: Preview | None) -> str:
    if found is None:
        return '<span class="muted">open the call</span>'
    if not found.text:
        return '<span class="muted">not kept</span>'
    check = (
        ""
        if found.matches
        else ' <strong class="mismatch">does not hash to the fingerprint</strong>'
    )
    return f'<code class="preview">{esc(found.text)}</code>{check}'


def waiting_since(call: pb.ToolCall) -> Timestamp:
    """Since when a call waits for a person: its outcome unknown, or its
    approval asked for."""
    if call.state == pb.CALL_STATE_UNKNOWN and call.HasField("unknown_since"):
        return call.unknown_since
    return call.created_at


def _waiting_rows(
    calls: list[pb.ToolCall],
    previews: dict[tuple[str, str, str], Preview],
    now_ns: int,
    *,
    quarantine: bool = False,
) -> list[list[str]]:
    return [
        [
            waited(waiting_since(c), now_ns),
            esc(c.ref.namespace),
            run_link(c.ref.namespace, c.ref.run_id),
            call_link(c.ref),
            esc(c.tool_name),
            _input(previews.get((c.ref.namespace, c.ref.run_id, c.ref.call_id))),
            *([never_ran(c, now_ns)] if quarantine else []),
            call_state(c),
        ]
        for c in calls
    ]


_HEADERS = ("Waiting", "Namespace", "Run", "Call", "Tool", "Input", "State")
_UNKNOWN_HEADERS = (*_HEADERS[:-1], '"Never ran" accepted', "State")


def never_ran(call: pb.ToolCall, now_ns: int) -> str:
    """When reconciling "it never ran" is accepted without a confirmation
    that the attempt is dead: at the end of the quarantine."""
    if not call.HasField("quarantine_ends_at"):
        return "-"
    return countdown(call.quarantine_ends_at, now_ns)


def queue(
    calls: list[pb.ToolCall],
    previews: dict[tuple[str, str, str], Preview],
    now_ns: int,
) -> str:
    """The queue's content (also served alone, for the live update)."""
    approval = [c for c in calls if c.state == pb.CALL_STATE_AWAITING_APPROVAL]
    unknown = [c for c in calls if c.state == pb.CALL_STATE_UNKNOWN]
    counts_a = Counter(c.ref.namespace for c in approval)
    counts_u = Counter(c.ref.namespace for c in unknown)
    namespaces = sorted(set(counts_a) | set(counts_u))
    summary = (
        f"{len(approval)} awaiting approval, {len(unknown)} needing reconciliation"
    )
    return (
        f'<p class="summary">{esc(summary)}</p>'
        + table(
            "Waiting per namespace",
            ("Namespace", "Awaiting approval", "Needs reconciliation"),
            [[esc(n), esc(counts_a[n]), esc(counts_u[n])] for n in namespaces],
        )
        + "<h2>Awaiting approval</h2>"
        + table(
            "Calls awaiting approval, oldest first",
            _HEADERS,
            _waiting_rows(approval, previews, now_ns),
        )
        + "<h2>Needs reconciliation</h2>"
        + table(
            "Calls whose outcome is unknown, oldest first",
            _UNKNOWN_HEADERS,
            _waiting_rows(unknown, previews, now_ns, quarantine=True),
        )
    )


def digest(calls: list[pb.ToolCall]) -> str:
    """What the live update compares: the queue changed or it did not. The
    times shown change by themselves (the live script counts them), so
    only the calls, their revisions and quarantines count here."""
    h = hashlib.sha256()
    for c in calls:
        h.update(
            "\0".join(
                (
                    c.ref.namespace,
                    c.ref.run_id,
                    c.ref.call_id,
                    str(c.revision),
                    str(c.quarantine_ends_at.ToNanoseconds()),
                )
            ).encode("utf-8", "surrogatepass")
            + b"\1"
        )
    return h.hexdigest()[:16]


def queue_page(
    calls: list[pb.ToolCall],
    previews: dict[tuple[str, str, str], Preview],
    now_ns: int,
) -> str:
    content = queue(calls, previews, now_ns)
    return (
        '<p id="live" class="live" role="status" aria-live="polite">'
        "This list updates by itself.</p>"
        '<noscript><p class="live">Reload the page to see new calls.</p></noscript>'
        f'<div id="queue" data-digest="{digest(calls)}">{content}</div>'
    )


def run_page(
    namespace: str,
    run_id: str,
    calls: list[pb.ToolCall],
    csrf: str,
    *,
    plan: list[rpb.RecoverResponse] | None = None,
    refused: str = "",
) -> str:
    rows = [
        [call_link(c.ref), esc(c.tool_name), call_state(c), esc(c.revision)]
        for c in sorted(calls, key=lambda c: c.ref.call_id)
    ]
    out = fields([("Namespace", esc(namespace)), ("Run", esc(run_id))]) + table(
        "Calls of this run", ("Call", "Tool", "State", "Revision"), rows
    )
    out += (
        "<h2>Recovery plan</h2>"
        "<p>What an agent resuming this run would be told for each call. Asking "
        "settles the run's expired leases (their outcome becomes unknown); it "
        "never runs anything.</p>"
        '<form method="post" action="/run/recover">'
        + hidden("csrf", csrf)
        + hidden("namespace", namespace)
        + hidden("run", run_id)
        + '<button type="submit">Show the recovery plan</button></form>'
    )
    if refused:
        out += notice(refused, "error")
    if plan is not None:
        items = [i for page in plan for i in page.items]
        out += table(
            "Recovery plan",
            ("Action", "Call", "Tool", "State", "Key"),
            [
                [
                    esc(
                        enum_name(rpb.RecoveryAction.Name(i.action), "RECOVERY_ACTION_")
                    ),
                    call_link(i.call.ref),
                    esc(i.call.tool_name),
                    call_state(i.call),
                    esc(i.idempotency_key or "-"),
                ]
                for i in items
            ],
        )
        interrupted = any(page.interrupted for page in plan)
        out += notice(
            "The run is interrupted: a call needs a person before it can go on."
            if interrupted
            else "The run can resume."
        )
    return out


def verification(v: apb.VerifyAuditResponse | None, refused: str) -> str:
    if v is None:
        return notice(f"Not verified: {refused}", "warn")
    if v.ok:
        return notice(
            f"The audit chain verifies: {v.entries_checked} "
            f"{'entry' if v.entries_checked == 1 else 'entries'} checked.",
            "ok",
        )
    return notice(
        f"The audit chain is BROKEN at entry {v.first_bad_sequence}: {v.problem} "
        f"({v.entries_checked} entries verified before it).",
        "error",
    )


def audit_page(
    namespace: str,
    entries: list[apb.AuditEntry],
    verified: apb.VerifyAuditResponse | None,
    verify_refused: str,
    refused: str = "",
) -> str:
    form = (
        '<form method="get" action="/audit" class="inline">'
        '<label for="ns">Namespace</label>'
        f'<input id="ns" name="namespace" value="{esc(namespace)}"'
        ' placeholder="every namespace">'
        '<button type="submit">Show</button></form>'
    )
    if refused:
        return verification(verified, verify_refused) + form + notice(refused, "error")
    rows = [
        [
            esc(e.sequence),
            at(e.at),
            esc(enum_name(apb.AuditAction.Name(e.action), "AUDIT_ACTION_")),
            esc(e.actor),
            call_link(e.ref, f"{e.ref.namespace}/{e.ref.run_id}/{e.ref.call_id}")
            if e.ref.run_id
            else "-",
            esc(f"{state_name(e.state_before)} → {audit_after(e)}")
            if e.ref.run_id
            else "-",
            esc(e.reason),
            esc(e.evidence or "-"),
        ]
        for e in entries
    ]
    return (
        verification(verified, verify_refused)
        + form
        + table(
            "Audit entries, newest first",
            ("Seq", "At", "Action", "Actor", "Call", "States", "Reason", "Evidence"),
            rows,
        )
    )
