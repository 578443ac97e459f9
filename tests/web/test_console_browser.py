"""`effectd console` in headless Chromium (Debian's `chromium`, driven by
Playwright; Playwright's own browser is never downloaded), against a real
daemon that requires tokens: what approvers and operators do with it.

With EFFECTD_CONSOLE_SCREENSHOTS=DIR the tests also save the pages docs/
shows (docs/console.md)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from effectd_client import Decision
from sidecar.testing import RunningDaemon
from sidecar.web import ConsoleServer
from tests.support.tokens import (
    APPROVER_ANA,
    APPROVER_BEN,
    ONCALL_OLA,
    VIEWER_VIC,
    Token,
)
from tests.web.support import NAMESPACE, RUN, agent, awaiting, console_daemon, unknown

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# How long a page waits for what it expects (the live queue polls every 2 s).
WAIT_MS = 20_000
SHOTS = os.environ.get("EFFECTD_CONSOLE_SCREENSHOTS")
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "Debian's chromium is missing: `make test` installs it"
    with sync_playwright() as p:
        launched = p.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


@pytest.fixture
def served(short_tmp: Path) -> Iterator[tuple[RunningDaemon, ConsoleServer]]:
    with console_daemon(short_tmp / "data") as both:
        yield both


def _person(
    browser: Browser, server: ConsoleServer, token: Token, *, phone: bool = False
) -> Page:
    """A new browser (own cookies) signed in with `token`."""
    options: dict[str, Any] = (
        {"viewport": {"width": 390, "height": 844}, "is_mobile": True}
        if phone
        else {"viewport": {"width": 1100, "height": 900}}
    )
    page = browser.new_context(**options).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{server.url}/signin")
    page.get_by_label("Your effectd token").fill(token.secret)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Waiting for a person")).to_be_visible()
    return page


def _shot(page: Page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def _open_call(page: Page, call_id: str) -> None:
    page.goto(f"{page.url.split('/', 3)[0]}//{page.url.split('/', 3)[2]}/")
    page.get_by_role("link", name=call_id, exact=True).click()
    expect(page.get_by_role("heading", name=f"Call {call_id}")).to_be_visible()


def _state(daemon: RunningDaemon, call_id: str) -> str:
    with agent(daemon) as c:
        return c.get_tool_call(RUN, call_id).state.name


def test_an_approver_approves_from_the_live_queue_and_the_agents_prepare_proceeds(
    served: tuple[RunningDaemon, ConsoleServer], browser: Browser
) -> None:
    """The queue is open when the agent asks; the call appears without a
    reload; the approver reads the input, approves with a reason, and the
    agent's waiting prepare (asking again until decided) gets EXECUTE."""
    daemon, server = served
    page = _person(browser, server, APPROVER_ANA, phone=True)
    expect(page.get_by_text("0 awaiting approval")).to_be_visible()
    decided = threading.Event()
    seen: list[Decision] = []

    def agent_waits() -> None:
        with agent(daemon) as c:
            # Bounded: at most 600 asks, each answered at once.
            for _ in range(600):
                prepared = c.prepare_tool(
                    RUN,
                    "wire-1",
                    "send_wire",
                    {"amount": 120, "to": "ACME"},
                    require_approval=True,
                    start=True,
                )
                seen.append(prepared.decision)
                if prepared.decision is not Decision.AWAIT_APPROVAL:
                    c.commit_tool(RUN, "wire-1", prepared.call.attempt, {"sent": True})
                    break
                decided.wait(0.1)

    thread = threading.Thread(target=agent_waits)
    thread.start()
    try:
        link = page.get_by_role("link", name="wire-1", exact=True)
        expect(link).to_be_visible()  # arrived without a reload
        expect(page.get_by_role("status").first).to_contain_text("Updated")
        _shot(page, "console-queue-phone.png")
        link.click()
        expect(page.locator("pre.json")).to_contain_text('"amount": 120')
        expect(page.get_by_text("hashes to the fingerprint")).to_be_visible()
        page.get_by_label("Reason (kept in the audit log)").fill("expected invoice")
        page.get_by_role("button", name="Approve").click()
        expect(page.get_by_text("You approved the call")).to_be_visible()
    finally:
        decided.set()
        thread.join(timeout=60)
    assert seen[0] is Decision.AWAIT_APPROVAL
    assert seen[-1] is Decision.EXECUTE
    assert _state(daemon, "wire-1") == "COMMITTED"


def test_two_people_decide_the_same_call_and_exactly_one_wins(
    served: tuple[RunningDaemon, ConsoleServer], browser: Browser
) -> None:
    """Ana and Ben open the same call; Ana approves first; Ben's rejection,
    from the page he had open, is refused and he reads why; Ana's approval
    stands."""
    daemon, server = served
    awaiting(daemon, "mail-1", value={"to": "all@example.com", "subject": "Q3"})
    ana = _person(browser, server, APPROVER_ANA)
    ben = _person(browser, server, APPROVER_BEN)
    for page, name in ((ana, "ana"), (ben, "ben")):
        _open_call(page, "mail-1")
        page.get_by_label("Reason (kept in the audit log)").fill(f"{name} decides")
    _shot(ana, "console-call.png")
    ana.get_by_role("button", name="Approve").click()
    expect(ana.get_by_text("You approved the call")).to_be_visible()
    ben.get_by_role("button", name="Reject").click()
    expect(ben.get_by_role("alert")).to_contain_text("Someone else decided first")
    expect(ben.get_by_text("approved by ana")).to_be_visible()
    _shot(ben, "console-conflict.png")
    assert _state(daemon, "mail-1") == "PREPARED"


def test_a_reconcile_with_evidence_shows_in_the_audit_view_and_the_chain_verifies(
    served: tuple[RunningDaemon, ConsoleServer], browser: Browser
) -> None:
    """The operator reconciles an unknown outcome as never executed: the
    quarantine refuses it first (and says so), then with the attempt
    confirmed dead it is accepted; the audit view shows the evidence and a
    verified chain."""
    daemon, server = served
    attempt = unknown(daemon, "charge-1")
    ola = _person(browser, server, ONCALL_OLA)
    expect(ola.get_by_text("1 needing reconciliation")).to_be_visible()
    _shot(ola, "console-queue.png")
    _open_call(ola, "charge-1")
    expect(ola.get_by_text("The quarantine rule.")).to_be_visible()

    def fill() -> None:
        ola.get_by_label("It never ran: the call may be executed again").check()
        ola.get_by_label("Evidence from the target system").fill(
            "no charge ch_123 in the payments dashboard"
        )
        ola.get_by_label("Reason (kept in the audit log)").fill("worker crashed")

    fill()
    _shot(ola, "console-reconcile.png")
    ola.get_by_role("button", name="Reconcile").click()
    expect(ola.get_by_role("alert")).to_contain_text("quarantine")
    assert _state(daemon, "charge-1") == "UNKNOWN"
    fill()
    ola.get_by_label(f"I know attempt {attempt}'s process is gone").check()
    ola.get_by_role("button", name="Reconcile").click()
    expect(ola.get_by_text("Reconciled: the call never ran")).to_be_visible()
    assert _state(daemon, "charge-1") == "PREPARED"
    ola.get_by_role("link", name="Audit log").click()
    expect(ola.get_by_text("The audit chain verifies")).to_be_visible()
    expect(
        ola.get_by_role("cell", name="no charge ch_123 in the payments dashboard")
    ).to_be_visible()
    _shot(ola, "console-audit.png")


def test_a_token_without_the_approver_role_cannot_approve(
    served: tuple[RunningDaemon, ConsoleServer], browser: Browser
) -> None:
    """Vic may read the queue but not decide: the page shows the daemon's
    refusal and the call still awaits approval."""
    daemon, server = served
    awaiting(daemon, "mail-2")
    vic = _person(browser, server, VIEWER_VIC)
    _open_call(vic, "mail-2")
    vic.get_by_label("Reason (kept in the audit log)").fill("why not")
    vic.get_by_role("button", name="Approve").click()
    expect(vic.get_by_role("alert")).to_contain_text("Your token may not do this")
    expect(vic.get_by_role("alert")).to_contain_text("approver role")
    assert _state(daemon, "mail-2") == "AWAITING_APPROVAL"


class _Forger(BaseHTTPRequestHandler):
    """Another origin's page: a form that posts a decision to the console."""

    target = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        fields = {
            "namespace": NAMESPACE,
            "run": RUN,
            "call": "mail-3",
            "revision": "2",
            "fingerprint": "",
            "decision": "approve",
            "reason": "forged",
            "csrf": "guess",
        }
        inputs = "".join(
            f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items()
        )
        body = (
            f'<form method="post" action="{self.target}/call/decide">{inputs}'
            '<button type="submit">Win a prize</button></form>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_forged_cross_site_post_is_refused(
    served: tuple[RunningDaemon, ConsoleServer], browser: Browser
) -> None:
    """A signed-in approver visits another site whose form posts an approval
    to the console: refused (its Origin is not the console's, and it has no
    session CSRF token), and the call still awaits approval."""
    daemon, server = served
    awaiting(daemon, "mail-3")
    ana = _person(browser, server, APPROVER_ANA)
    handler = type("Forger", (_Forger,), {"target": server.url})
    evil = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=evil.serve_forever, daemon=True)
    thread.start()
    try:
        ana.goto(f"http://localhost:{evil.server_address[1]}/")
        ana.get_by_role("button", name="Win a prize").click()
        expect(ana.get_by_role("alert")).to_contain_text("cross-site request forgery")
    finally:
        evil.shutdown()
        evil.server_close()
        thread.join(timeout=10)
    assert _state(daemon, "mail-3") == "AWAITING_APPROVAL"


def test_the_waiting_times_and_the_quarantine_count_in_the_page(
    served: tuple[RunningDaemon, ConsoleServer], browser: Browser
) -> None:
    """The live script keeps the queue's waiting times and the reconcile
    form's countdown current (issue 25 item 10): it takes each time over
    (data-seen) and writes it in the page's format."""
    daemon, server = served
    unknown(daemon, "c-1")
    page = _person(browser, server, ONCALL_OLA)
    waited = page.locator("time[data-since]").first
    expect(waited).to_have_attribute("data-seen", re.compile(r"^\d+$"))
    expect(waited).to_have_text(re.compile(r"^\d+[smhd]"))
    left = page.locator("time[data-until]").first
    expect(left).to_have_text(re.compile(r"^in \d+[smh]"))
    _open_call(page, "c-1")
    countdown = page.locator(".rule time[data-until]")
    expect(countdown).to_have_attribute("data-seen", re.compile(r"^\d+$"))
    expect(countdown).to_have_text(re.compile(r"^in \d+[smh]"))
    expect(page.get_by_role("heading", name="Other calls of this run")).to_be_visible()
