"""The page frame and the small pieces every page is built from. Every
text that came from the daemon (and so from an agent or a person) goes
through `esc`: HTML-escaped, and control and format characters (bidi
overrides, zero-width) made visible as `effectd ctl` shows them.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from urllib.parse import quote

from effectd.v1 import ledger_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.ctl.output import age, printable, when
from sidecar.ctl.schema import rfc3339
from sidecar.ctl.states import display_state
from sidecar.web.sessions import Session


def esc(value: object) -> str:
    return html.escape(printable(str(value)), quote=True)


def at(ts: Timestamp) -> str:
    return esc(when(ts))


def _ms(ts: Timestamp) -> int:
    return ts.ToNanoseconds() // 1_000_000


def waited(ts: Timestamp, now_ns: int) -> str:
    """How long since `ts`, kept current in the page by the live script."""
    if not ts.seconds and not ts.nanos:
        return "-"
    return (
        f'<time datetime="{esc(rfc3339(ts.seconds, ts.nanos))}" '
        f'data-since="{_ms(ts)}" data-now="{now_ns // 1_000_000}" '
        f'title="since {at(ts)}">{esc(age(now_ns - ts.ToNanoseconds()))}</time>'
    )


def countdown(ts: Timestamp, now_ns: int) -> str:
    """The time left until `ts` ("now" once it passed), counted down in the
    page by the live script."""
    left = ts.ToNanoseconds() - now_ns
    text = f"in {age(left)}" if left > 0 else "now"
    return (
        f'<time datetime="{esc(rfc3339(ts.seconds, ts.nanos))}" '
        f'data-until="{_ms(ts)}" data-now="{now_ns // 1_000_000}" '
        f'title="{at(ts)}">{esc(text)}</time>'
    )


def state(name: str) -> str:
    """A state as a person reads it (`sidecar.ctl.states`)."""
    return f'<span class="state state-{esc(name.lower())}">{esc(name)}</span>'


def call_state(call: pb.ToolCall) -> str:
    return state(display_state(call))


def table(caption: str, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table; cells are HTML already (escape them with `esc`)."""
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    # Each cell names its column too: on a phone a row is shown as a card.
    body = "".join(
        "<tr>"
        + "".join(
            f'<td data-label="{esc(h)}">{cell}</td>'
            for h, cell in zip(headers, row, strict=True)
        )
        + "</tr>"
        for row in rows
    )
    if not body:
        return f'<p class="empty">{esc(caption)}: none.</p>'
    return (
        f'<div class="scroll"><table><caption>{esc(caption)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def fields(pairs: Iterable[tuple[str, str]]) -> str:
    """A definition list; values are HTML already."""
    items = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs)
    return f"<dl>{items}</dl>"


def hidden(name: str, value: object) -> str:
    return f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'


def notice(text: str, kind: str = "info") -> str:
    role = "alert" if kind == "error" else "status"
    return f'<p class="notice notice-{kind}" role="{role}">{esc(text)}</p>'


def call_link(ref: pb.CallRef, text: str | None = None) -> str:
    query = (
        f"namespace={html.escape(_q(ref.namespace))}&amp;run={html.escape(_q(ref.run_id))}"
        f"&amp;call={html.escape(_q(ref.call_id))}"
    )
    return f'<a href="/call?{query}">{esc(text or ref.call_id)}</a>'


def run_link(namespace: str, run_id: str, text: str | None = None) -> str:
    return (
        f'<a href="/run?namespace={html.escape(_q(namespace))}'
        f'&amp;run={html.escape(_q(run_id))}">{esc(text or run_id)}</a>'
    )


def _q(text: str) -> str:
    return quote(text, safe="")


def signed_in(session: Session) -> str:
    """Who is signed in, as the header says it: the token's name and roles
    as the daemon named them, or the name given to a daemon without tokens."""
    if session.actor:
        return (
            f"Signed in as <b>{esc(session.actor)}</b> "
            "(the daemon has no tokens: the audit log records this name)"
        )
    if not session.shown_name:
        return "Signed in with a token"
    roles = ", ".join(session.roles) or "no roles"
    return f"Signed in as <b>{esc(session.shown_name)}</b> ({esc(roles)})"


def page(
    title: str,
    body: str,
    *,
    session: Session | None = None,
    live: bool = False,
) -> str:
    """The whole document: a skip link, the navigation (with who is signed
    in and sign-out), and `body` as its main content; `live` loads the
    script that refreshes the queue and counts down the quarantines."""
    nav = ""
    if session is not None:
        nav = (
            '<nav aria-label="Console"><ul>'
            '<li><a href="/">Queue</a></li>'
            '<li><a href="/audit">Audit log</a></li>'
            "</ul>"
            '<form method="post" action="/signout" class="signout">'
            f"{hidden('csrf', session.csrf)}<span>{signed_in(session)}</span> "
            '<button type="submit">Sign out</button></form></nav>'
        )
    script = '<script src="/static/live.js" defer></script>' if live else ""
    return (
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · effectd console</title>"
        '<link rel="stylesheet" href="/static/console.css">'
        f"{script}</head><body>"
        '<a class="skip" href="#main">Skip to content</a>'
        f'<header><p class="brand">effectd console</p>{nav}</header>'
        f'<main id="main" tabindex="-1"><h1>{esc(title)}</h1>{body}</main>'
        "</body></html>"
    )
