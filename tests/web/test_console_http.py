"""`effectd console` at the HTTP level, against a real daemon that requires
tokens: sign-in, the session cookie, the checks a state-changing request
passes (Host, Origin, the session's CSRF token), escaping of what agents
and people wrote, and the exposure rule of its listener."""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

from effectd_client import Channel, Client
from sidecar.cli import main
from sidecar.config import ConfigError, ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from sidecar.web import ConsoleConfig, ConsoleServer
from sidecar.web.plumbing import Plumbing
from sidecar.web.sessions import Session
from tests.support.certs import make_pki
from tests.support.processes import ROOT
from tests.support.tokens import APPROVER_ANA, ONCALL_OLA, UNKNOWN_SECRET, VIEWER_VIC
from tests.web.support import (
    NAMESPACE,
    RUN,
    Browserless,
    agent,
    awaiting,
    console_daemon,
    unknown,
)


@pytest.fixture
def served(short_tmp: Path) -> Iterator[tuple[RunningDaemon, ConsoleServer]]:
    with console_daemon(short_tmp / "data") as both:
        yield both


def _call_path(call_id: str) -> str:
    return f"/call?namespace={NAMESPACE}&run={RUN}&call={call_id}"


def _decide_form(
    page_csrf: str,
    call_id: str,
    revision: int,
    fingerprint: str,
    decision: str = "approve",
) -> dict[str, str]:
    return {
        "csrf": page_csrf,
        "namespace": NAMESPACE,
        "run": RUN,
        "call": call_id,
        "revision": str(revision),
        "fingerprint": fingerprint,
        "decision": decision,
        "reason": "looks right",
    }


def _state(daemon: RunningDaemon, call_id: str) -> tuple[str, int, str]:
    with agent(daemon) as c:
        call = c.get_tool_call(RUN, call_id)
    return call.state.name, call.revision, call.input_fingerprint


def test_sign_in_sets_a_strict_http_only_cookie_and_an_unknown_token_is_refused(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """The daemon judges the token: an unknown one gets no session; a known
    one gets an HttpOnly, SameSite=Strict cookie (not Secure over plain
    loopback HTTP), and signing out ends the session on the server too."""
    _, server = served
    b = Browserless(server.url)
    refused = b.sign_in(UNKNOWN_SECRET)
    assert refused.status == 401
    assert "does not know this token" in refused.body
    assert "effectd_console" not in b.jar
    assert b.get("/").status == 303
    done = b.sign_in(APPROVER_ANA.secret)
    assert done.status == 303
    cookie = next(c for c in done.cookies() if c.startswith("effectd_console="))
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Secure" not in cookie
    queue = b.get("/")
    assert queue.status == 200
    assert "Waiting for a person" in queue.body
    stolen = dict(b.jar)
    assert b.post("/signout", {"csrf": queue.csrf()}).status == 303
    # The old cookie, replayed, is no session any more.
    replay = Browserless(server.url, stolen)
    assert replay.get("/").status == 303
    assert replay.get("/queue.fragment").status == 401


def test_a_cross_site_post_is_refused_and_nothing_changes(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """A decision POST from another origin, without any Origin or Referer,
    with the wrong CSRF token, or sent to another Host name is refused and
    the call stays as it was; the control: the same form from the console's
    own page approves."""
    daemon, server = served
    awaiting(daemon, "c-1")
    _, revision, fingerprint = _state(daemon, "c-1")
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    csrf = b.get(_call_path("c-1")).csrf()
    form = _decide_form(csrf, "c-1", revision, fingerprint)
    forged = b.post("/call/decide", form, Origin="https://evil.example")
    assert forged.status == 403
    assert "cross-site request forgery" in forged.body
    assert b.post("/call/decide", form, Origin="").status == 403
    referred = b.post(
        "/call/decide", form, Origin="", Referer="https://evil.example/page"
    )
    assert referred.status == 403
    wrong = b.post("/call/decide", {**form, "csrf": "not-the-token"})
    assert wrong.status == 403
    rebound = b.post(
        "/call/decide", form, Host="evil.example", Origin="http://evil.example"
    )
    assert rebound.status == 421
    # Another person's session has a CSRF token of its own.
    other = Browserless(server.url)
    other.sign_in(APPROVER_ANA.secret)
    assert other.post("/call/decide", form).status == 403
    assert _state(daemon, "c-1")[0] == "AWAITING_APPROVAL"
    ok = b.post("/call/decide", form, Origin="", Referer=f"{server.url}/call")
    assert ok.status == 303
    assert _state(daemon, "c-1")[0] == "PREPARED"


def test_a_sign_in_post_needs_the_sign_in_pages_own_check(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """Login CSRF: a sign-in posted without the sign-in page's cookie (a
    forged form signing the victim into the attacker's session) is refused."""
    _, server = served
    b = Browserless(server.url)
    forged = b.post("/signin", {"csrf": "x", "token": APPROVER_ANA.secret})
    assert forged.status == 403
    assert "effectd_console" not in b.jar


def test_a_token_without_the_approver_role_cannot_approve(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """The session has the token's rights, no more: the daemon refuses the
    decision, the page says so, and the call is unchanged."""
    daemon, server = served
    awaiting(daemon, "c-2")
    before = _state(daemon, "c-2")
    b = Browserless(server.url)
    b.sign_in(VIEWER_VIC.secret)
    page = b.get(_call_path("c-2"))
    answer = b.post(
        "/call/decide", _decide_form(page.csrf(), "c-2", before[1], before[2])
    )
    assert answer.status == 403
    assert "Your token may not do this" in answer.body
    assert "approver role" in answer.body
    assert _state(daemon, "c-2") == before


def test_what_agents_and_people_wrote_is_rendered_escaped(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """Script in a call's input and in a rejection's reason is shown as
    text on the call page, the queue and the audit log, never as markup;
    a bidi override is made visible."""
    daemon, server = served
    evil = "<script>alert('x')</script>"
    awaiting(daemon, "c-3", value={"body": evil, "name": "a\u202eb"})
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    page = b.get(_call_path("c-3"))
    assert "<script>alert" not in page.body
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page.body
    assert "\u202e" not in page.body
    assert "\\u202e" in page.body
    _, revision, fingerprint = _state(daemon, "c-3")
    form = _decide_form(page.csrf(), "c-3", revision, fingerprint, "reject")
    form["reason"] = f"no {evil}"
    assert b.post("/call/decide", form).status == 303
    after = b.get(_call_path("c-3"))
    assert "<script>alert" not in after.body
    assert "no &lt;script&gt;" in after.body
    assert "Content-Security-Policy" in dict(after.headers)
    oncall = Browserless(server.url)
    oncall.sign_in(ONCALL_OLA.secret)
    audit = oncall.get("/audit")
    assert "no &lt;script&gt;" in audit.body
    assert "<script>alert" not in audit.body


def test_a_stale_page_never_overwrites(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """Two approvers open the same call; the first decision wins; the
    second, sent with the revision its page showed, is refused with
    "someone else decided first" and the first decision stands."""
    daemon, server = served
    awaiting(daemon, "c-4")
    _, revision, fingerprint = _state(daemon, "c-4")
    ana, ben = Browserless(server.url), Browserless(server.url)
    ana.sign_in(APPROVER_ANA.secret)
    ben.sign_in(APPROVER_ANA.secret)
    ana_csrf = ana.get(_call_path("c-4")).csrf()
    ben_csrf = ben.get(_call_path("c-4")).csrf()
    first = ana.post(
        "/call/decide", _decide_form(ana_csrf, "c-4", revision, fingerprint, "approve")
    )
    assert first.status == 303
    second = ben.post(
        "/call/decide", _decide_form(ben_csrf, "c-4", revision, fingerprint, "reject")
    )
    assert second.status == 409
    assert "Someone else decided first" in second.body
    assert _state(daemon, "c-4")[0] == "PREPARED"


def test_the_listener_follows_the_daemons_exposure_rule(short_tmp: Path) -> None:
    """A console on an address other than loopback without TLS is refused
    (as the daemon's TCP listener is); with TLS it is allowed; half a TLS
    pair is refused. Nothing binds to a non-loopback address here."""
    with pytest.raises(ConfigError, match="not a loopback address"):
        ConsoleConfig(target="unix:x", listen="0.0.0.0:8470").address()
    with pytest.raises(ConfigError, match="not a loopback address"):
        ConsoleConfig(target="unix:x", listen="192.0.2.1:8470").address()
    pki = make_pki(short_tmp)
    tls = ConsoleConfig(
        target="unix:x",
        listen="192.0.2.1:8470",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
    )
    assert tls.address() == ("192.0.2.1", 8470)
    with pytest.raises(ConfigError, match="both or neither"):
        ConsoleConfig(target="unix:x", tls_cert=pki.server.cert).address()
    assert ConsoleConfig(target="unix:x", listen="[::1]:0").address() == ("[::1]", 0)


def test_over_tls_the_session_cookie_is_secure(short_tmp: Path) -> None:
    """Behind TLS the cookies carry Secure (and the answers HSTS); the
    console verifies nothing about the browser but serves only TLS."""
    pki = make_pki(short_tmp / "pki")
    with console_daemon(short_tmp / "data") as (daemon, _):
        server = ConsoleServer(
            ConsoleConfig(
                target=daemon.target,
                listen="127.0.0.1:0",
                tls_cert=pki.server.cert,
                tls_key=pki.server.key,
            )
        ).start()
        try:
            assert server.url.startswith("https://127.0.0.1:")
            context = ssl.create_default_context(cafile=str(pki.ca))
            b = Browserless(server.url, tls=context)
            done = b.sign_in(APPROVER_ANA.secret)
            assert done.status == 303
            cookie = next(c for c in done.cookies() if c.startswith("effectd_console="))
            assert "Secure" in cookie
            assert "max-age" in done.header("Strict-Transport-Security")
        finally:
            server.stop()


def test_effectd_console_refuses_a_public_address_without_tls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`effectd console --listen 0.0.0.0:PORT` without TLS exits 2 naming
    the rule, before binding anything; `--help` names the subcommand."""
    code = main(["console", "--target", "unix:x.sock", "--listen", "0.0.0.0:8470"])
    assert code == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err
    assert "tls-cert and tls-key" in err


def test_reconcile_as_committed_with_the_result_found(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """The operator records the result found: the call is COMMITTED with
    it, the evidence is on the call's page; a result that is not JSON is
    refused before the daemon is asked, and the call stays UNKNOWN."""
    daemon, server = served
    unknown(daemon, "u-1")
    _, revision, _ = _state(daemon, "u-1")
    b = Browserless(server.url)
    b.sign_in(ONCALL_OLA.secret)
    page = b.get(_call_path("u-1"))
    assert "The quarantine rule." in page.body
    form = {
        "csrf": page.csrf(),
        "namespace": NAMESPACE,
        "run": RUN,
        "call": "u-1",
        "revision": str(revision),
        "resolution": "committed",
        "result": "{not json",
        "evidence": "charge ch_9 in the dashboard",
        "reason": "found it",
    }
    bad = b.post("/call/reconcile", form)
    assert bad.status == 400
    assert "not valid JSON" in bad.body
    assert _state(daemon, "u-1")[0] == "UNKNOWN"
    done = b.post("/call/reconcile", {**form, "result": '{"charge": "ch_9"}'})
    assert done.status == 303
    after = b.get(done.header("Location"))
    assert "Reconciled: the call is committed" in after.body
    assert "charge ch_9 in the dashboard" in after.body
    with agent(daemon) as c:
        call = c.get_tool_call(RUN, "u-1")
    assert call.state.name == "COMMITTED"
    assert call.result is not None
    assert json.loads(call.result.json_text or "") == {"charge": "ch_9"}


def test_an_mcp_calls_result_must_be_a_call_tool_result(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """An MCP call's reconcile form shows the CallToolResult shape its result
    takes; a bare string is refused by the daemon, the page says the shape
    wanted, and the call stays UNKNOWN (issue 25 item 5: fails before the
    fix: the string was committed, and the resumed agent failed on it)."""
    daemon, server = served
    with agent(daemon) as c:
        prepared = c.prepare_tool(
            RUN, "m-1", "mcp://pay/charge", {"id": 9}, start=True, channel=Channel.MCP
        )
        c.report_unknown(RUN, "m-1", prepared.call.attempt, "the process died")
    b = Browserless(server.url)
    b.sign_in(ONCALL_OLA.secret)
    page = b.get(_call_path("m-1"))
    shape = (
        "{&quot;content&quot;: [{&quot;type&quot;: &quot;text&quot;, &quot;text&quot;"
        ": &quot;...&quot;}], &quot;isError&quot;: false}"
    )
    assert f"an MCP CallToolResult object, e.g. <code>{shape}</code>" in page.body
    refused = b.post(
        "/call/reconcile",
        {
            "csrf": page.csrf(),
            "namespace": NAMESPACE,
            "run": RUN,
            "call": "m-1",
            "revision": str(_state(daemon, "m-1")[1]),
            "resolution": "committed",
            "result": '"charged i-9"',
            "evidence": "charge ch_9 in the dashboard",
            "reason": "found it",
        },
    )
    assert refused.status == 400
    assert (
        f"result: an MCP call&#x27;s result is an MCP CallToolResult object, e.g. "
        f"{shape}: the result is a string, not an object"
    ) in refused.body
    assert _state(daemon, "m-1")[0] == "UNKNOWN"


def test_the_reconcile_page_shows_what_the_unknown_call_was_sent(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """An UNKNOWN side effect prepared without approval, under the default
    policy, shows its input on its page, checked against its fingerprint,
    so the operator knows what to look for (issue 25 item 7: fails before
    the fix: "The input is not kept for this call")."""
    daemon, server = served
    unknown(daemon, "u-sent")
    b = Browserless(server.url)
    b.sign_in(ONCALL_OLA.secret)
    page = b.get(_call_path("u-sent"))
    assert "The quarantine rule." in page.body
    assert "The input is not kept for this call." not in page.body
    assert "&quot;id&quot;: &quot;u-sent&quot;" in page.body
    assert "This input hashes to the fingerprint" in page.body


def test_a_result_reconciled_in_the_console_is_stored_as_ctl_stores_it(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """The same result found, recorded once from the console and once through
    the client `effectd ctl reconcile` uses, is stored in the same bytes: an
    agent replaying either gets the same result text."""
    daemon, server = served
    found = {"zeta": "café", "amount": 1250, "ids": ["ch_9"]}
    for call_id in ("by-console", "by-ctl"):
        unknown(daemon, call_id)
    b = Browserless(server.url)
    b.sign_in(ONCALL_OLA.secret)
    page = b.get(_call_path("by-console"))
    done = b.post(
        "/call/reconcile",
        {
            "csrf": page.csrf(),
            "namespace": NAMESPACE,
            "run": RUN,
            "call": "by-console",
            "revision": str(_state(daemon, "by-console")[1]),
            "resolution": "committed",
            "result": json.dumps(found, indent=2),
            "evidence": "charge ch_9 in the dashboard",
            "reason": "found it",
        },
    )
    assert done.status == 303
    with Client(daemon.target, namespace=NAMESPACE, token=ONCALL_OLA.secret) as ctl:
        ctl.reconcile(
            RUN,
            "by-ctl",
            expected_revision=_state(daemon, "by-ctl")[1],
            operator="ola",
            reason="found it",
            evidence="charge ch_9 in the dashboard",
            result=found,
        )
    with agent(daemon) as c:
        console = c.get_tool_call(RUN, "by-console").result
        by_ctl = c.get_tool_call(RUN, "by-ctl").result
    assert console is not None
    assert by_ctl is not None
    assert console.json_text == by_ctl.json_text


def test_a_runs_recovery_plan_is_a_post_and_needs_a_role_that_may_recover(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """The run page lists the run's calls; its recovery plan comes from a
    POST (Recover settles expired leases) and names each call's action; an
    approver's token may not recover, and the page says so."""
    daemon, server = served
    awaiting(daemon, "a-1")
    unknown(daemon, "u-2")
    ola = Browserless(server.url)
    ola.sign_in(ONCALL_OLA.secret)
    run = ola.get(f"/run?namespace={NAMESPACE}&run={RUN}")
    assert run.status == 200
    assert "a-1" in run.body
    assert "u-2" in run.body
    form = {"csrf": run.csrf(), "namespace": NAMESPACE, "run": RUN}
    plan = ola.post("/run/recover", form)
    assert plan.status == 200
    assert "WAIT_FOR_APPROVAL" in plan.body
    assert "RECONCILE" in plan.body
    assert "The run is interrupted" in plan.body
    ana = Browserless(server.url)
    ana.sign_in(APPROVER_ANA.secret)
    form["csrf"] = ana.get(f"/run?namespace={NAMESPACE}&run={RUN}").csrf()
    refused = ana.post("/run/recover", form)
    assert "Your token may not do this" in refused.body


def test_the_audit_view_says_when_the_token_may_not_verify_or_read(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """An approver's token may not read the audit log: the page shows both
    refusals instead of an empty, seemingly verified log."""
    _, server = served
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    audit = b.get("/audit?namespace=team-c")
    assert audit.status == 200
    assert "Not verified" in audit.body
    assert "verifies" not in audit.body
    assert "Your token may not do this" in audit.body


def test_pages_assets_and_errors(served: tuple[RunningDaemon, ConsoleServer]) -> None:
    """Assets are served with their types; an unknown page, an unknown call
    and a form without a revision answer as such; the live fragment needs a
    session and has a digest; a malformed Content-Length is refused."""
    daemon, server = served
    b = Browserless(server.url)
    assert b.get("/static/console.css").header("Content-Type").startswith("text/css")
    assert "fetch" in b.get("/static/live.js").body
    assert b.get("/favicon.ico").status == 404
    b.sign_in(APPROVER_ANA.secret)
    assert b.get("/nowhere").status == 404
    missing = b.get(_call_path("nobody"))
    assert missing.status == 404
    assert b.get("/call?namespace=team-c").status == 400
    fragment = b.get("/queue.fragment")
    assert fragment.status == 200
    assert len(fragment.header("X-Queue-Digest")) == 16
    awaiting(daemon, "c-9")
    assert b.get("/queue.fragment").header("X-Queue-Digest") != fragment.header(
        "X-Queue-Digest"
    )
    csrf = b.get("/").csrf()
    form = {"csrf": csrf, "namespace": NAMESPACE, "run": RUN, "call": "c-9"}
    assert b.post("/call/decide", {**form, "decision": "approve"}).status == 400
    assert b.post("/call/decide", {**form, "decision": "maybe"}).status == 400
    assert b.post("/call/reconcile", {**form, "resolution": "?"}).status == 400
    assert b.post("/nowhere", {"csrf": csrf}).status == 404
    assert b.post("/", {"csrf": csrf}, **{"Content-Length": "-1"}).status == 400
    assert _state(daemon, "c-9")[0] == "AWAITING_APPROVAL"


@pytest.mark.parametrize("number", ["9" * 30, "\u00b2", "\u0661"])
def test_a_number_out_of_range_or_not_ascii_is_refused_and_nothing_changes(
    served: tuple[RunningDaemon, ConsoleServer], number: str
) -> None:
    """A revision, a dead attempt or a Content-Length that Python reads as
    digits but that is no number the console sends ("²", Arabic-Indic
    digits, more than 64 bits) answers 400 (the connection is not dropped),
    and the call stays as it was; the control: the same form with the
    page's revision decides."""
    daemon, server = served
    awaiting(daemon, "n-1")
    unknown(daemon, "n-2")
    _, revision, fingerprint = _state(daemon, "n-1")
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    decide = _decide_form(b.get(_call_path("n-1")).csrf(), "n-1", revision, fingerprint)
    assert b.post("/call/decide", {**decide, "revision": number}).status == 400
    if number.isascii() or number == "\u00b2":  # a header is Latin-1
        length = b.post("/call/decide", decide, **{"Content-Length": number})
        assert length.status == 400
    b.sign_in(ONCALL_OLA.secret)
    csrf = b.get(_call_path("n-2")).csrf()
    reconcile = {
        "csrf": csrf,
        "namespace": NAMESPACE,
        "run": RUN,
        "call": "n-2",
        "revision": str(_state(daemon, "n-2")[1]),
        "resolution": "not_executed",
        "evidence": "no charge in the dashboard",
        "reason": "never ran",
        "confirmed_dead_attempt": number,
    }
    assert b.post("/call/reconcile", reconcile).status == 400
    nested = {**reconcile, "resolution": "committed", "confirmed_dead_attempt": ""}
    assert b.post("/call/reconcile", {**nested, "result": "[" * 15000}).status == 400
    assert _state(daemon, "n-1")[0] == "AWAITING_APPROVAL"
    assert _state(daemon, "n-2")[0] == "UNKNOWN"
    b.sign_in(APPROVER_ANA.secret)
    csrf = b.get(_call_path("n-1")).csrf()
    decided = b.post("/call/decide", _decide_form(csrf, "n-1", revision, fingerprint))
    assert decided.status == 303
    assert _state(daemon, "n-1")[0] != "AWAITING_APPROVAL"


def test_without_tokens_on_the_daemon_a_person_gives_their_name(
    short_tmp: Path,
) -> None:
    """A daemon without tokens (its loopback default): signing in needs a
    name, which the audit log records for the decision."""
    config = ServeConfig(data_dir=short_tmp / "data", init=True)
    with running_daemon(config) as daemon:
        server = ConsoleServer(
            ConsoleConfig(target=daemon.target, listen="127.0.0.1:0")
        ).start()
        try:
            with Client(daemon.target, namespace=NAMESPACE, session=False) as c:
                c.prepare_tool(RUN, "n-1", "send", {"a": 1}, require_approval=True)
                seen = c.get_tool_call(RUN, "n-1")
            b = Browserless(server.url)
            page = b.get("/signin")
            nameless = b.post("/signin", {"csrf": page.csrf(), "token": ""})
            assert nameless.status == 400
            assert "give your name" in nameless.body
            named = b.post(
                "/signin", {"csrf": page.csrf(), "token": "", "name": "alice"}
            )
            assert named.status == 303
            assert "Signed in as <b>alice</b>" in b.get("/").body
            csrf = b.get(_call_path("n-1")).csrf()
            form = _decide_form(csrf, "n-1", seen.revision, seen.input_fingerprint)
            decided = b.post("/call/decide", form)
            assert decided.status == 303
            assert "approved by alice" in b.get(decided.header("Location")).body
        finally:
            server.stop()


def test_an_unreachable_daemon_is_said_at_sign_in(short_tmp: Path) -> None:
    """No daemon at the target: sign-in says the daemon did not answer."""
    server = ConsoleServer(
        ConsoleConfig(
            target=f"unix:{short_tmp / 'absent.sock'}",
            listen="127.0.0.1:0",
            timeout=2,
        )
    ).start()
    try:
        b = Browserless(server.url)
        answer = b.sign_in(APPROVER_ANA.secret)
        assert answer.status == 401
        assert "did not answer" in answer.body
    finally:
        server.stop()


def test_negative_control_a_console_without_its_checks_lets_the_forgery_through(
    served: tuple[RunningDaemon, ConsoleServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forgery test can fail: with the Origin and CSRF checks taken out
    of the console, the same cross-site POST approves the call."""
    daemon, server = served
    awaiting(daemon, "c-x")
    _, revision, fingerprint = _state(daemon, "c-x")
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    monkeypatch.setattr(Plumbing, "_check_origin", lambda self: None)
    monkeypatch.setattr(Session, "csrf_matches", lambda self, presented: True)
    form = _decide_form("forged", "c-x", revision, fingerprint)
    forged = b.post("/call/decide", form, Origin="https://evil.example")
    assert forged.status == 303
    assert _state(daemon, "c-x")[0] == "PREPARED"


@pytest.mark.slow
def test_effectd_console_as_a_process_serves_and_stops_on_sigterm(
    short_tmp: Path,
) -> None:
    """`effectd console --listen 127.0.0.1:0` says where it serves, serves
    the sign-in page there (no daemon is asked before a sign-in), and exits
    0 on SIGTERM."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sidecar",
            "console",
            "--target",
            f"unix:{short_tmp / 'absent.sock'}",
            "--listen",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("effectd console serving on http://127.0.0.1:"), line
        url = line.split()[4]
        assert Browserless(url).get("/signin").status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def _raw(
    server: ConsoleServer,
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    body: str = "",
) -> int:
    """The status of a request sent with exactly these headers, repeated
    ones included (http.client's `request` sends each name once)."""
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders(body.encode() if body else None)
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def test_a_request_with_two_host_headers_is_refused_and_nothing_changes(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """A decision POST whose first Host is the console's and whose second is
    another name is refused 400, and so is a page asked that way; the call
    stays as it was, and the same request with one Host approves it (issue
    25 item 20: fails before the fix: the first Host passed the check and
    the call was approved)."""
    daemon, server = served
    awaiting(daemon, "c-h")
    _, revision, fingerprint = _state(daemon, "c-h")
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    csrf = b.get(_call_path("c-h")).csrf()
    body = urlencode(_decide_form(csrf, "c-h", revision, fingerprint))
    own = urlsplit(server.url).netloc
    common = [
        ("Cookie", "; ".join(f"{k}={v}" for k, v in b.jar.items())),
        ("Origin", server.url),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Content-Length", str(len(body))),
    ]
    twice = [("Host", own), ("Host", "evil.example"), *common]
    assert _raw(server, "POST", "/call/decide", twice, body) == 400
    assert _raw(server, "GET", "/", twice[:3]) == 400
    assert _state(daemon, "c-h")[0] == "AWAITING_APPROVAL"
    once = [("Host", own), *common]
    assert _raw(server, "POST", "/call/decide", once, body) == 303
    assert _state(daemon, "c-h")[0] == "PREPARED"
