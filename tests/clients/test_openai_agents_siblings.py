"""effectd_client.contrib.openai_agents: the parallel calls of a step killed
together are named by one interruption, though their leases run out at
different times (each was last renewed at its own heartbeat); a sibling
whose attempt is alive is not named."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import (
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)

from effectd_client import AsyncClient, Client, State
from effectd_client.contrib.openai_agents import AgentLedger, LedgerInterruption
from effectd_client.testing import TestDaemon, running_daemon

set_tracing_disabled(True)

# The lease of the sibling still STARTED: it runs out after the first's.
LATER_MS = 1500
# A live attempt's lease and its heartbeats (bounded in count).
LIVE_MS, BEATS, BEAT_S = 600, 60, 0.1


@pytest.fixture(scope="module")
def daemon() -> Iterator[TestDaemon]:
    with running_daemon() as d:
        yield d


def parallel_agent(ledger: AgentLedger, sent: list[str]) -> Agent[Any]:
    """Sends to Ann and to Bo in one model response (p-1, p-2)."""

    @function_tool(failure_error_function=None)
    async def send(to: str) -> str:
        """Sends a message."""
        sent.append(to)
        return f"sent to {to}"

    def answer(call: ModelCall) -> Any:
        if not isinstance(call.input, list) or len(call.input) < 2:
            return [
                function_call("send", {"to": "ann"}, call_id="p-1"),
                function_call("send", {"to": "bo"}, call_id="p-2"),
            ]
        return [assistant_message("done")]

    model = ScriptedModel([ModelStep.respond(answer) for _ in range(4)])
    return Agent(name="trip", model=model, tools=[ledger.tool(send)])


def crashed_step(target: str, run: str, *, second_lease_ms: int) -> int:
    """p-1 UNKNOWN (its process died), p-2 STARTED with a lease still
    running; returns p-2's attempt."""
    with Client(target) as client:
        held = client.prepare_tool(run, "p-1", "send", {"to": "ann"}, start=True)
        client.report_unknown(run, "p-1", held.call.attempt, "the process died")
        second = client.prepare_tool(
            run, "p-2", "send", {"to": "bo"}, start=True, lease_ms=second_lease_ms
        )
        return second.call.attempt


async def restart(target: str, run: str, sent: list[str]) -> LedgerInterruption:
    async with AsyncClient(target) as effectd:
        ledger = AgentLedger(effectd)
        with ledger.run(run), pytest.raises(LedgerInterruption) as stopped:
            await Runner.run(parallel_agent(ledger, sent), "send")
    return stopped.value


def test_a_sibling_whose_lease_runs_out_later_is_named_at_once(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """p-2 died with p-1, but its lease ends later: the interruption waits it
    out and names both (fails before the fix: it named p-1 alone, and p-2
    took another reconcile-and-resume round)."""
    run = f"sib-{tmp_path.name}"
    crashed_step(daemon.target, run, second_lease_ms=LATER_MS)
    sent: list[str] = []
    stopped = asyncio.run(restart(daemon.target, run, sent))
    named = {c.call_id: c.state for c in stopped.calls}
    assert named == {"p-1": State.UNKNOWN, "p-2": State.UNKNOWN}
    assert sent == []


def test_a_sibling_whose_attempt_is_alive_is_not_named(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """The same step, p-2's attempt alive (it heartbeats): the interruption
    does not wait for it past one lease, and does not name it."""
    run = f"live-{tmp_path.name}"
    attempt = crashed_step(daemon.target, run, second_lease_ms=LIVE_MS)
    sent: list[str] = []

    async def alive_while_restarting() -> LedgerInterruption:
        async with AsyncClient(daemon.target) as effectd:

            async def beat() -> None:
                for _ in range(BEATS):
                    await effectd.heartbeat(run, "p-2", attempt, LIVE_MS)
                    await asyncio.sleep(BEAT_S)

            beating = asyncio.create_task(beat())
            try:
                return await restart(daemon.target, run, sent)
            finally:
                beating.cancel()

    stopped = asyncio.run(alive_while_restarting())
    assert [c.call_id for c in stopped.calls] == ["p-1"]
    with Client(daemon.target) as client:
        assert client.get_tool_call(run, "p-2").state is State.STARTED
    assert sent == []
