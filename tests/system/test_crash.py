"""Durability across kill -9 of the daemon process (ADR-010 D1, D3).

A call acknowledged as committed is COMMITTED with its result after a
restart; a call that was STARTED at the kill is UNKNOWN, and its side effect
answers RECONCILE, never EXECUTE. The negative control is a daemon that
answers before its commit: the same check must catch it. Both run for
commits answered on the session stream too, whose answers leave through
another path than the unary ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb

from effectd_client import Client, Decision, EffectdError, State
from tests.rpc.sessions import Conversation, message
from tests.support import postgres
from tests.support.processes import daemon_process

RESULT = b"\x00receipt-42\xff"


def _commit_one(client: Client, call_id: str) -> None:
    started = client.prepare_tool(
        "run-1", call_id, "charge_card", {"cents": 100}, start=True
    )
    assert started.attempt_held
    client.commit_tool("run-1", call_id, started.call.attempt, RESULT)


def durability_violations(client: Client, acknowledged: list[str]) -> list[str]:
    """Acknowledged commits that are not COMMITTED with their exact result."""
    found = []
    for call_id in acknowledged:
        try:
            call = client.get_tool_call("run-1", call_id)
        except EffectdError as exc:
            found.append(f"{call_id}: {exc.reason}")
            continue
        if call.state is not State.COMMITTED or call.result is None:
            found.append(f"{call_id}: {call.state.name}")
        elif call.result.raw != RESULT:
            found.append(f"{call_id}: result {call.result.raw!r}")
    return found


def _store_args(store_url: str | None) -> tuple[str, ...]:
    return () if store_url is None else ("--store", store_url)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_kind", postgres.WITH_BOUNCER)
def test_commits_survive_kill_9_and_started_calls_become_unknown(
    short_tmp: Path, store_url: str | None
) -> None:
    """After kill -9: committed stays committed, STARTED becomes UNKNOWN
    (on the shared store too: the restarted daemon is a new incarnation)."""
    data = short_tmp / "data"
    with daemon_process(data, args=_store_args(store_url)) as d:
        with Client(d.target) as c:
            for i in range(20):
                _commit_one(c, f"done-{i}")
            running = c.prepare_tool(
                "run-1", "in-flight", "send_email", {"to": "a"}, start=True
            )
            assert running.attempt_held
        d.kill9()
    with (
        daemon_process(data, args=_store_args(store_url)) as d,
        Client(d.target) as c,
    ):
        assert durability_violations(c, [f"done-{i}" for i in range(20)]) == []
        call = c.get_tool_call("run-1", "in-flight")
        assert call.state is State.UNKNOWN
        assert call.history[-1] == "restart"
        again = c.prepare_tool(
            "run-1", "in-flight", "send_email", {"to": "a"}, start=True
        )
        assert again.decision is Decision.RECONCILE
        assert not again.attempt_held
        with pytest.raises(EffectdError) as refused:
            c.start_tool("run-1", "in-flight", retry=True)
        assert refused.value.reason == "RECONCILIATION_REQUIRED"
        assert d.terminate() == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_negative_control_ack_before_commit_is_caught(short_tmp: Path) -> None:
    """A daemon that replies before committing loses an acknowledged call."""
    data = short_tmp / "data"
    with daemon_process(data, module="tests.support.ack_before_commit") as d:
        with Client(d.target) as c:
            _commit_one(c, "done-0")
        d.kill9()
    with daemon_process(data) as d, Client(d.target) as c:
        assert durability_violations(c, ["done-0"]) != []


def _commit_in_session(target: str, call_ids: list[str]) -> list[str]:
    """Prepares, starts and commits each call with messages of one session
    stream; the calls whose commit was answered."""
    answered = []
    with grpc.insecure_channel(target) as channel:
        conversation = Conversation(channel)
        for i, call_id in enumerate(call_ids):
            ref = pb.CallRef(run_id="run-1", call_id=call_id)
            started = pb.PrepareToolRequest(
                ref=ref,
                tool_name="charge_card",
                input=pb.Payload(json='{"cents": 100}'),
                start=True,
            )
            conversation.send(message(2 * i, started))
            attempt = conversation.receive().prepare_tool.call.attempt
            result = pb.ToolResult(
                outcome=pb.OUTCOME_OK, payload=pb.Payload(raw=RESULT)
            )
            commit = pb.CommitToolRequest(ref=ref, attempt=attempt, result=result)
            conversation.send(message(2 * i + 1, commit))
            answer = conversation.receive()
            assert answer.commit_tool.call.state == pb.CALL_STATE_COMMITTED, answer
            answered.append(call_id)
        conversation.cancel()
    return answered


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_kind", postgres.WITH_BOUNCER)
def test_commits_answered_on_a_session_survive_kill_9(
    short_tmp: Path, store_url: str | None
) -> None:
    """Commits answered as session messages are COMMITTED after kill -9."""
    data = short_tmp / "data"
    args = _store_args(store_url)
    with daemon_process(data, args=args) as d:
        acknowledged = _commit_in_session(d.target, [f"s-{i}" for i in range(20)])
        d.kill9()
    with daemon_process(data, args=args) as d, Client(d.target) as c:
        assert durability_violations(c, acknowledged) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_negative_control_a_session_answered_before_commit_is_caught(
    short_tmp: Path,
) -> None:
    """A daemon that replies before committing loses a commit answered on
    the session stream: the same check says so."""
    data = short_tmp / "data"
    with daemon_process(data, module="tests.support.ack_before_commit") as d:
        acknowledged = _commit_in_session(d.target, ["s-0"])
        d.kill9()
    with daemon_process(data) as d, Client(d.target) as c:
        assert durability_violations(c, acknowledged) != []


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_second_daemon_on_the_same_data_directory_fails_loudly(short_tmp: Path) -> None:
    """A second daemon exits with an error instead of taking over the socket."""
    data = short_tmp / "data"
    with daemon_process(data) as first:
        second = subprocess.run(
            [sys.executable, "-m", "sidecar", "serve", "--data-dir", str(data)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert second.returncode == 2
        assert "in use by another effectd" in second.stderr
        with Client(first.target) as c:
            assert c.prepare_tool("r", "c", "t", {}).decision is Decision.EXECUTE
