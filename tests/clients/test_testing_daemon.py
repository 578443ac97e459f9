"""effectd_client.testing for users: a real daemon, and a crash mid-call
that the user's own test can catch duplicating a side effect."""

from __future__ import annotations

import os
from pathlib import Path

from effectd_client import Client, ReconciliationNeeded, Run, State
from effectd_client.pytest_plugin import effectd_daemon  # noqa: F401
from effectd_client.testing import (
    CrashPoint,
    TestDaemon,
    crash_and_resume,
    running_daemon,
)

# A short lease: the crashed attempt's runs out quickly.
LEASE_MS = 300


def _book(counter: Path) -> str:
    """The user's side effect: one booking more in an external counter."""
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    return f"booking #{n}"


def agent(target: str, counter: str) -> str:
    """An agent whose side effect goes through the safe call."""
    with Client(target) as client:
        run = Run(client, "trip-1", lease_ms=LEASE_MS)
        with run.call("book", {"city": "Oslo"}, call_id="book-1") as step:
            if step.execute:
                step.set_result(_book(Path(counter)))
        return str(step.result)


def careless_agent(target: str, counter: str) -> str:
    """Negative control: a new call id on every run (the process id)."""
    with Client(target) as client:
        run = Run(client, "trip-2", lease_ms=LEASE_MS)
        with run.call("book", {"city": "Oslo"}, call_id=f"book-{os.getpid()}") as step:
            if step.execute:
                step.set_result(_book(Path(counter)))
        return str(step.result)


def test_a_crash_before_the_commit_is_reconciled_not_repeated(tmp_path: Path) -> None:
    """Killed after its effect, before its commit: the resumed agent meets
    ReconciliationNeeded and the counter shows one booking."""
    counter = tmp_path / "bookings"
    with running_daemon() as daemon:
        report = crash_and_resume(
            agent, daemon.target, str(counter), at=CrashPoint.BEFORE_COMMIT
        )
        with Client(daemon.target) as client:
            assert client.get_tool_call("trip-1", "book-1").state is State.UNKNOWN
    assert report.crashed
    assert isinstance(report.resumed_error, ReconciliationNeeded)
    assert counter.read_text() == "1"


def test_a_crash_after_the_commit_replays_the_result(tmp_path: Path) -> None:
    """Killed after its commit: the resumed agent gets the stored result."""
    counter = tmp_path / "bookings"
    with running_daemon() as daemon:
        report = crash_and_resume(
            agent, daemon.target, str(counter), at=CrashPoint.AFTER_COMMIT
        )
    assert report.crashed
    assert (report.resumed, report.resumed_error) == ("booking #1", None)
    assert counter.read_text() == "1"


def test_the_crash_catches_an_agent_that_changes_its_call_ids(tmp_path: Path) -> None:
    """Negative control: call ids that change across a restart book twice,
    and the same check shows it."""
    counter = tmp_path / "bookings"
    with running_daemon() as daemon:
        report = crash_and_resume(
            careless_agent, daemon.target, str(counter), at=CrashPoint.BEFORE_COMMIT
        )
    assert report.crashed
    assert report.resumed == "booking #2"
    assert counter.read_text() == "2"


def test_the_fixture_serves_a_daemon(effectd_daemon: TestDaemon) -> None:  # noqa: F811
    """`effectd_daemon` (the pytest plugin) is a real daemon that records."""
    with Client(effectd_daemon.target) as client:
        p = client.prepare_tool("r", "c", "t", {"x": 1})
        assert p.call.state is State.PREPARED
    assert "ready on" in effectd_daemon.stderr()
