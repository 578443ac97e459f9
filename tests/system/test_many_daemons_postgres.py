"""Several daemon processes on one PostgreSQL store (issue 14, "many
daemons, one ledger"), each with its own socket and so its own daemon id.

Daemon B's clean restart and its lease sweeps leave daemon A's live
STARTED call as A left it; B's own call in flight is UNKNOWN after B's
restart. After kill -9 of A, its side effect becomes UNKNOWN once A's
registration lapsed, answered RECONCILE, never EXECUTE, and B's live call is
untouched. The negative control is a daemon B on the single-daemon rule
(`tests.support.single_daemon_rule`): the same check catches it. The test
fails, never skips, when PostgreSQL is not reachable (the `pg_url` fixture).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from effectd_client import Client, Decision, State
from tests.support.processes import daemon_process

pytestmark = pytest.mark.slow

# Short enough that a killed daemon's calls settle within the test; renewed
# every 2 s, long enough that a loaded machine does not let a live
# daemon's registration lapse.
TTL = "6"
LEASE_MS = 600_000  # the registration, not the lease, decides here
INPUT = {"to": "a@example.com"}


def _args(url: str) -> tuple[str, ...]:
    return ("--store", url, "--registration-ttl", TTL, "--settle-interval", "0.5")


def _start(client: Client, run_id: str, call_id: str) -> None:
    answer = client.prepare_tool(
        run_id, call_id, "send_email", INPUT, start=True, lease_ms=LEASE_MS
    )
    assert answer.attempt_held


def live_call_violations(client: Client, run_id: str, call_id: str) -> list[str]:
    """What another daemon did to a live daemon's STARTED call: nothing, if
    it is still STARTED and a repeat answers IN_PROGRESS."""
    found = []
    call = client.get_tool_call(run_id, call_id)
    if call.state is not State.STARTED:
        found.append(f"{call_id}: {call.state.name} ({call.history[-1]})")
    again = client.prepare_tool(run_id, call_id, "send_email", INPUT, start=True)
    if again.decision is not Decision.IN_PROGRESS:
        found.append(f"{call_id}: answered {again.decision.name}")
    return found


def _wait_for_state(
    client: Client, run_id: str, call_id: str, state: State, bound: float = 60.0
) -> State:
    """The call's state once it is `state`, or as it is after `bound` seconds."""
    end = time.monotonic() + bound
    while True:
        found = client.get_tool_call(run_id, call_id).state
        if found is state or time.monotonic() > end:
            return found
        time.sleep(0.2)


def _restart_b_beside_a(short_tmp: Path, url: str, b_module: str) -> list[str]:
    """A serves a call; B serves one, restarts (as `b_module`); what B's
    restart and passes did to A's call."""
    args = _args(url)
    with daemon_process(short_tmp / "a", args=args) as a, Client(a.target) as ca:
        _start(ca, "run-a", "a1")
        with daemon_process(short_tmp / "b", args=args) as b:
            with Client(b.target) as cb:
                _start(cb, "run-b", "b1")
            assert b.terminate() == 0
        with (
            daemon_process(short_tmp / "b", module=b_module, args=args) as b,
            Client(b.target) as cb,
        ):
            # B's own call in flight at its restart is settled.
            assert _wait_for_state(cb, "run-b", "b1", State.UNKNOWN) is State.UNKNOWN
            violations = live_call_violations(cb, "run-a", "a1")
            assert b.terminate() == 0
        assert a.terminate() == 0
    return violations


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_another_daemons_restart_leaves_a_live_call_started(
    short_tmp: Path, pg_url: str
) -> None:
    assert _restart_b_beside_a(short_tmp, pg_url, "sidecar") == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_negative_control_a_daemon_on_the_single_daemon_rule_is_caught(
    short_tmp: Path, pg_url: str
) -> None:
    violations = _restart_b_beside_a(
        short_tmp, pg_url, "tests.support.single_daemon_rule"
    )
    assert violations != []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_settles_only_the_killed_daemons_calls_once_it_lapsed(
    short_tmp: Path, pg_url: str
) -> None:
    args = _args(pg_url)
    with daemon_process(short_tmp / "b", args=args) as b, Client(b.target) as cb:
        with daemon_process(short_tmp / "a", args=args) as a:
            with Client(a.target) as ca:
                _start(ca, "run-a", "a1")
            _start(cb, "run-b", "b1")
            assert live_call_violations(cb, "run-a", "a1") == []
            a.kill9()
        assert _wait_for_state(cb, "run-a", "a1", State.UNKNOWN) is State.UNKNOWN
        settled = cb.get_tool_call("run-a", "a1")
        assert settled.history[-1] == "expire"
        again = cb.prepare_tool("run-a", "a1", "send_email", INPUT, start=True)
        assert again.decision is Decision.RECONCILE
        assert not again.attempt_held
        assert live_call_violations(cb, "run-b", "b1") == []
        assert b.terminate() == 0
