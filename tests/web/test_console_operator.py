"""What an operator must see in the console to decide (issue 25): the state
a person reads, how long each call has waited, when "never ran" becomes
allowed, who is signed in, the input of each queued call, the other calls of
the run; and the console's own limits on idle connections and sessions."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub
from google.protobuf.timestamp_pb2 import Timestamp

from effectd_client import Client
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from sidecar.web import ConsoleConfig, ConsoleServer
from tests.support.tokens import APPROVER_ANA, ONCALL_OLA
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


def _reject(daemon: RunningDaemon, call_id: str) -> None:
    with Client(
        daemon.target, namespace=NAMESPACE, token=APPROVER_ANA.secret, session=False
    ) as approver:
        seen = approver.get_tool_call(RUN, call_id)
        approver.decide_approval(
            RUN,
            call_id,
            approve=False,
            approver="",
            reason="wrong customer",
            expected_revision=seen.revision,
            input_fingerprint=seen.input_fingerprint,
        )


REJECTED = '<span class="state state-rejected">REJECTED</span>'


def test_a_rejected_call_reads_rejected_on_the_run_call_and_audit_pages(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """The run's table, the call's state and history, and the audit log say
    REJECTED for a rejected call (issue 25 item 8: fails before the fix: they
    said COMMITTED); a call the agent committed with an error of its own
    still says COMMITTED (the control)."""
    daemon, server = served
    awaiting(daemon, "c-1")
    _reject(daemon, "c-1")
    with agent(daemon) as c:
        held = c.prepare_tool(RUN, "c-2", "charge", {"id": 2}, start=True)
        c.commit_tool(RUN, "c-2", held.call.attempt, error_code="DECLINED")
    b = Browserless(server.url)
    b.sign_in(ONCALL_OLA.secret)
    run = b.get(f"/run?namespace={NAMESPACE}&run={RUN}").body
    assert run.count(REJECTED) == 1
    assert run.count('<span class="state state-committed">COMMITTED</span>') == 1
    call = b.get(_call_path("c-1")).body
    assert f"<dt>State</dt><dd>{REJECTED}</dd>" in call
    assert '<td data-label="To">REJECTED</td>' in call
    assert '<td data-label="To">COMMITTED</td>' not in call
    audit = b.get("/audit").body
    assert "AWAITING_APPROVAL → REJECTED" in audit
    other = b.get(_call_path("c-2")).body
    assert '<dt>State</dt><dd><span class="state state-committed">' in other


# -- what an operator sees to decide (issue 25 item 10) -------------------------


@contextmanager
def _console_at(
    data_dir: Path, shift_s: float, **options: Any
) -> Iterator[tuple[RunningDaemon, ConsoleServer]]:
    """A daemon requiring the console's tokens whose wall clock is `shift_s`
    seconds off the real one (which the console reads), and its console."""
    clock = ManualClock(wall_ns=time.time_ns() + int(shift_s * 1e9))
    with console_daemon(data_dir, clock, **options) as both:
        yield both


def _ms(ts: Timestamp) -> int:
    return ts.ToNanoseconds() // 1_000_000


def _read(daemon: RunningDaemon, call_id: str) -> pb.ToolCall:
    with grpc.insecure_channel(daemon.target) as channel:
        return (
            ToolLedgerStub(channel)
            .GetToolCall(
                pb.GetToolCallRequest(
                    ref=pb.CallRef(namespace=NAMESPACE, run_id=RUN, call_id=call_id)
                ),
                timeout=5,
                metadata=(("authorization", f"Bearer {ONCALL_OLA.secret}"),),
            )
            .call
        )


def test_the_queue_shows_how_long_each_call_waited_its_input_and_its_quarantine(
    short_tmp: Path,
) -> None:
    """Each queued call says since when it waits (counted on by the page),
    the start of its input, escaped, and for an unknown outcome when "it
    never ran" is accepted (fails before the fix: none of the three)."""
    with _console_at(short_tmp / "data", -7200) as (daemon, server):
        awaiting(daemon, "c-1", value={"to": "ana@example.com", "x": "\u202e<b>"})
        unknown(daemon, "c-2")
        waiting, lost = _read(daemon, "c-1"), _read(daemon, "c-2")
        b = Browserless(server.url)
        b.sign_in(ONCALL_OLA.secret)
        queue = b.get("/").body
    assert f'data-since="{_ms(waiting.created_at)}"' in queue
    assert f'data-since="{_ms(lost.unknown_since)}"' in queue
    assert ">2h</time>" in queue
    assert (
        '<code class="preview">{&quot;to&quot;:&quot;ana@example.com&quot;,'
        "&quot;x&quot;:&quot;\\u202e&lt;b&gt;&quot;}</code>"
    ) in queue
    assert '<code class="preview">{&quot;id&quot;:&quot;c-2&quot;}</code>' in queue
    assert f'data-until="{_ms(lost.quarantine_ends_at)}"' in queue
    assert "\u202e" not in queue


def test_the_reconcile_form_counts_down_to_the_end_of_the_quarantine(
    short_tmp: Path,
) -> None:
    """Before the end: "refused until the quarantine ends", with the time
    left counting down; after it: "accepted", with when it ended."""
    with _console_at(short_tmp / "ahead", 3600) as (daemon, server):
        unknown(daemon, "c-1")
        ends = _read(daemon, "c-1").quarantine_ends_at
        b = Browserless(server.url)
        b.sign_in(ONCALL_OLA.secret)
        page = b.get(_call_path("c-1")).body
    assert "refused until the quarantine ends at" in page
    assert f'data-until="{_ms(ends)}"' in page
    assert ">in 1h" in page
    assert '<script src="/static/live.js" defer></script>' in page
    with _console_at(short_tmp / "behind", -3600) as (daemon, server):
        unknown(daemon, "c-1")
        b = Browserless(server.url)
        b.sign_in(ONCALL_OLA.secret)
        page = b.get(_call_path("c-1")).body
    assert "accepted: the quarantine (counted from" in page


def test_the_header_says_who_is_signed_in(
    served: tuple[RunningDaemon, ConsoleServer], short_tmp: Path
) -> None:
    """With a token: the daemon's name for it and its roles; without tokens
    on the daemon: the name given (fails before the fix: "Signed in with a
    token")."""
    _, server = served
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    assert "Signed in as <b>ana</b> (approver)" in b.get("/").body
    ola = Browserless(server.url)
    ola.sign_in(ONCALL_OLA.secret)
    assert "Signed in as <b>ola</b> (operator)" in ola.get("/").body
    with running_daemon(ServeConfig(data_dir=short_tmp / "open", init=True)) as daemon:
        console = ConsoleServer(
            ConsoleConfig(target=daemon.target, listen="127.0.0.1:0")
        ).start()
        try:
            c = Browserless(console.url)
            form = c.get("/signin")
            c.post("/signin", {"csrf": form.csrf(), "token": "", "name": "Ada"})
            assert "Signed in as <b>Ada</b> (the daemon has no tokens" in (
                c.get("/").body
            )
        finally:
            console.stop()


def test_a_calls_page_shows_the_other_calls_of_its_run(
    served: tuple[RunningDaemon, ConsoleServer],
) -> None:
    """An approver sees what else the run did and asks, beside the call."""
    daemon, server = served
    awaiting(daemon, "c-1")
    awaiting(daemon, "c-2", tool="refund")
    unknown(daemon, "c-3")
    b = Browserless(server.url)
    b.sign_in(APPROVER_ANA.secret)
    page = b.get(_call_path("c-1")).body
    others = page.split("<h2>Other calls of this run</h2>", 1)[1]
    assert ">c-2</a>" in others
    assert ">c-3</a>" in others
    assert ">c-1</a>" not in others
    assert "refund" in others


def test_idle_connections_are_closed_and_connections_are_capped(
    short_tmp: Path,
) -> None:
    """Half-sent requests hold their connection for the idle timeout only;
    a connection over the cap is answered 503 at once; once the idle ones
    are closed the console serves again (fails before the fix: the half-sent
    requests held their connections and the third one was taken)."""
    with _console_at(short_tmp / "data", 0, max_connections=2, idle_timeout=0.5) as (
        _,
        server,
    ):
        host, port = str(server.httpd.server_address[0]), server.httpd.server_address[1]
        idle = [socket.create_connection((host, port), timeout=10) for _ in range(2)]
        for s in idle:
            s.sendall(b"GET /signin HTTP/1.1\r\nHost: ")
        # Both are taken: the next connection is refused.
        over = socket.create_connection((host, port), timeout=10)
        for s in idle:
            assert s.recv(1024) == b""  # closed by the console
            s.close()
        busy = over.recv(1024)
        over.close()
        assert busy.startswith(b"HTTP/1.1 503 ")
        assert Browserless(server.url).get("/signin").status == 200


def test_sessions_are_capped_the_least_recently_used_ends(short_tmp: Path) -> None:
    """Past the cap a new sign-in ends the session used least recently, and
    its channel; the others go on."""
    with _console_at(short_tmp / "data", 0, max_sessions=2) as (_, server):
        first, second, third = (Browserless(server.url) for _ in range(3))
        first.sign_in(APPROVER_ANA.secret)
        second.sign_in(APPROVER_ANA.secret)
        assert first.get("/").status == 200  # first is now the most recent
        third.sign_in(ONCALL_OLA.secret)
        assert len(server.sessions) == 2
        assert second.get("/").status == 303
        assert first.get("/").status == 200
        assert third.get("/").status == 200
