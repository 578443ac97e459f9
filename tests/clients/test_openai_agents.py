"""effectd_client.contrib.openai_agents: an Agents SDK agent (the SDK's own Runner and
ScriptedModel, no network) against a real daemon runs its side effect at most
once across a SIGKILL and a restored RunState, replays committed results, and
holds an approval across a crash for the exact arguments only."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    Runner,
    RunState,
    function_tool,
    set_tracing_disabled,
)
from agents.mcp import MCPServerStdio, MCPServerStdioParams
from agents.testing import (
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)

from effectd_client import (
    ApprovalPending,
    AsyncClient,
    CallInProgress,
    Channel,
    Client,
    Effect,
    InputMismatch,
    ReconciliationNeeded,
    State,
    ToolCall,
    ToolTimedOut,
)
from effectd_client.contrib.mcp import McpPolicy
from effectd_client.contrib.openai_agents import (
    DEFAULT_REJECTION_MESSAGE,
    AgentLedger,
    ApprovalMismatch,
    LedgerInterruption,
    NoLedgerRun,
    ToolPolicy,
)
from effectd_client.testing import (
    CrashPoint,
    TestDaemon,
    crash_and_resume,
    running_daemon,
)
from tests.clients.mcp.servers import SERVER, executions, kill_server
from tests.support.imports import imported_by

set_tracing_disabled(True)

# A short lease: a crashed attempt's runs out quickly.
LEASE_MS = 300
LOOKUP, SEND = "c-lookup", "c-send"


# -- the agent under test (module level: it also runs in a spawned child) -------


def run_id(workdir: Path) -> str:
    """Each test's run: its own directory's name (unique in a session)."""
    return f"trip-{workdir.name}"


def bump(path: Path) -> int:
    """One effect more in an external counter (a file)."""
    n = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(n))
    return n


def count(workdir: Path, tool: str) -> int:
    path = workdir / tool
    return int(path.read_text()) if path.exists() else 0


def tools(workdir: Path, *, approval: bool) -> tuple[FunctionTool, FunctionTool]:
    """`lookup` (a read) and `send` (a side effect). `send` kills its process
    after its effect, before anything is recorded, when `crash-in-send` is
    there (and removes it, so the resumed run does not die again)."""

    @function_tool(failure_error_function=None)
    async def lookup(query: str) -> str:
        """Looks a contact up."""
        return f"found {query} (#{bump(workdir / 'lookup')})"

    @function_tool(failure_error_function=None, needs_approval=approval)
    async def send(to: str) -> str:
        """Sends a message."""
        n = bump(workdir / "send")
        crash = workdir / "crash-in-send"
        if crash.exists():
            crash.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return f"sent to {to} (#{n})"

    return lookup, send


def outputs_of(call: ModelCall) -> dict[str, str]:
    items = call.input if isinstance(call.input, list) else []
    return {
        str(item["call_id"]): str(item["output"])
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def model(to: str = "ann") -> ScriptedModel:
    """A deterministic model: looks Ann up, sends to `to`, then says what the
    send returned; each answer follows from the transcript it is given, so
    a run started again or resumed from a RunState goes on where it is."""

    def answer(call: ModelCall) -> Any:
        seen = outputs_of(call)
        if LOOKUP not in seen:
            return [function_call("lookup", {"query": "Ann"}, call_id=LOOKUP)]
        if SEND not in seen:
            return [function_call("send", {"to": to}, call_id=SEND)]
        return [assistant_message(f"model saw: {seen[SEND]}")]

    return ScriptedModel([ModelStep.respond(answer) for _ in range(6)])


def build(
    ledger: AgentLedger | None, workdir: Path, *, approval: bool, to: str = "ann"
) -> Agent[Any]:
    lookup, send = tools(workdir, approval=approval)
    if ledger is not None:
        lookup = ledger.tool(lookup, effect=Effect.READ)
        send = ledger.tool(send)
    return Agent(name="trip", model=model(to), tools=[lookup, send])


async def run_agent(
    target: str,
    workdir: Path,
    *,
    ledgered: bool = True,
    approval: bool = False,
    to: str = "ann",
) -> str:
    """The application: starts the run, or resumes it from the RunState saved
    at its last interruption; saves the RunState when interrupted."""
    saved = workdir / "state.json"
    async with AsyncClient(target) as effectd:
        ledger = AgentLedger(effectd, lease_ms=LEASE_MS)
        agent = build(ledger if ledgered else None, workdir, approval=approval, to=to)
        with ledger.run(run_id(workdir)):
            if saved.exists():
                state = await RunState.from_string(agent, saved.read_text())
                if ledgered:
                    await ledger.apply_decisions(state)
                result = await Runner.run(agent, state)
            else:
                result = await Runner.run(agent, "send Ann the itinerary")
            if result.interruptions:
                saved.write_text(result.to_state().to_string())
                return "interrupted"
            return str(result.final_output)


def agent(target: str, workdir: str) -> str:
    return asyncio.run(run_agent(target, Path(workdir)))


def plain_agent(target: str, workdir: str) -> str:
    """Negative control: the same agent, its tools not wrapped."""
    return asyncio.run(run_agent(target, Path(workdir), ledgered=False))


def approving_agent(target: str, workdir: str) -> str:
    return asyncio.run(run_agent(target, Path(workdir), approval=True))


def approve_then_die(target: str, workdir: str) -> None:
    """The agent's process approves (effectd and its RunState in memory), and
    is killed before it saves the RunState or resumes the run."""
    asyncio.run(decide(target, Path(workdir), approve=True, in_state=True))
    os.kill(os.getpid(), signal.SIGKILL)


def plain_approving_agent(target: str, workdir: str) -> str:
    return asyncio.run(run_agent(target, Path(workdir), ledgered=False, approval=True))


# -- helpers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[TestDaemon]:
    """One real daemon (a process) for the module; each test its own run."""
    with running_daemon() as running:
        yield running


def killed_in_child(fn: Any, target: str, workdir: Path) -> int | None:
    """Runs `fn(target, workdir)` in a spawned process; its exit code."""
    child = multiprocessing.get_context("spawn").Process(
        target=fn, args=(target, str(workdir))
    )
    child.start()
    child.join(120)
    if child.exitcode is None:
        child.kill()
        child.join(10)
    code = child.exitcode
    child.close()
    return code


def wait_unknown(target: str, workdir: Path, call_id: str) -> None:
    """Lets the killed attempt's lease run out; the daemon's recovery marks
    the call UNKNOWN, as it would before a restarted agent asks."""
    with Client(target) as client:
        for _ in range(600):
            client.recover(run_id(workdir))
            if client.get_tool_call(run_id(workdir), call_id).state is State.UNKNOWN:
                return
            time.sleep(0.05)
    raise AssertionError(f"{call_id} did not turn UNKNOWN")


def state_of(target: str, workdir: Path, call_id: str) -> State:
    with Client(target) as client:
        return client.get_tool_call(run_id(workdir), call_id).state


async def interrupted(target: str, workdir: Path) -> None:
    assert await run_agent(target, workdir, approval=True) == "interrupted"


async def decide(
    target: str,
    workdir: Path,
    *,
    approve: bool,
    to: str | None = None,
    in_state: bool = False,
) -> None:
    """The approver: decides the saved RunState's interruption in effectd
    (and, `in_state`, in the RunState in memory; the file is unchanged)."""
    async with AsyncClient(target) as effectd:
        ledger = AgentLedger(effectd)
        agent = build(ledger, workdir, approval=True)
        state = await RunState.from_string(agent, (workdir / "state.json").read_text())
        (item,) = state.get_interruptions()
        if to is not None:
            item.raw_item.arguments = json.dumps({"to": to})  # type: ignore[union-attr]
        with ledger.run(run_id(workdir)):
            if approve:
                await ledger.approve(
                    item, approver="ann", state=state if in_state else None
                )
            else:
                await ledger.reject(item, approver="ann", reason="not today")


# -- at most once across a crash ------------------------------------------------


@pytest.mark.slow
def test_a_crash_inside_the_side_effect_is_surfaced_never_rerun(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Killed in `send` after its effect, before its commit: the run started
    again replays the committed lookup, then stops at the in-doubt send with
    ReconciliationNeeded; each effect happened once."""
    (tmp_path / "crash-in-send").touch()
    assert killed_in_child(agent, daemon.target, tmp_path) == -signal.SIGKILL
    wait_unknown(daemon.target, tmp_path, SEND)
    with pytest.raises(LedgerInterruption) as stopped:
        agent(daemon.target, str(tmp_path))
    assert isinstance(stopped.value.cause, ReconciliationNeeded)
    assert stopped.value.call is not None
    assert stopped.value.call.call_id == SEND
    assert (count(tmp_path, "lookup"), count(tmp_path, "send")) == (1, 1)
    assert state_of(daemon.target, tmp_path, LOOKUP) is State.COMMITTED


@pytest.mark.slow
def test_the_unwrapped_tool_runs_twice_across_the_same_crash(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Negative control: without the ledger the same crash and restart send
    twice (and look up twice), which the test above would catch."""
    (tmp_path / "crash-in-send").touch()
    assert killed_in_child(plain_agent, daemon.target, tmp_path) == -signal.SIGKILL
    assert plain_agent(daemon.target, str(tmp_path)) == "model saw: sent to ann (#2)"
    assert (count(tmp_path, "lookup"), count(tmp_path, "send")) == (2, 2)


@pytest.mark.slow
def test_a_crash_after_a_commit_replays_the_stored_result(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Killed right after the first commit (the lookup's): the resumed run
    gets the lookup's stored result without running it, then sends once."""
    report = crash_and_resume(
        agent, daemon.target, str(tmp_path), at=CrashPoint.AFTER_COMMIT
    )
    assert report.crashed, report
    assert report.resumed == "model saw: sent to ann (#1)", report
    assert (count(tmp_path, "lookup"), count(tmp_path, "send")) == (1, 1)


def test_a_committed_call_is_replayed_to_the_model(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """The same run again: every call is answered from the ledger, and the
    model sees the stored output of the first run."""
    first = agent(daemon.target, str(tmp_path))
    again = agent(daemon.target, str(tmp_path))
    assert first == again == "model saw: sent to ann (#1)"
    assert (count(tmp_path, "lookup"), count(tmp_path, "send")) == (1, 1)


def test_a_streamed_run_goes_through_the_ledger_too(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """`Runner.run_streamed` started inside `ledger.run`: its tools are keyed
    by the run as well; streamed again, the send is replayed."""

    async def streamed() -> str:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd)
            agent = build(ledger, tmp_path, approval=False)
            with ledger.run(run_id(tmp_path)):
                result = Runner.run_streamed(agent, "send Ann the itinerary")
                async for _ in result.stream_events():
                    pass
            return str(result.final_output)

    assert asyncio.run(streamed()) == asyncio.run(streamed())
    assert (count(tmp_path, "lookup"), count(tmp_path, "send")) == (1, 1)
    assert state_of(daemon.target, tmp_path, SEND) is State.COMMITTED


# -- approvals ----------------------------------------------------------------


@pytest.mark.slow
def test_an_approval_holds_after_a_crash_and_a_restored_runstate(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Interrupted for approval, the RunState saved; the process approves and
    is killed before saving it: a new process restores the RunState (which
    holds no approval) and the send runs, once; restored again, it is
    replayed."""
    asyncio.run(interrupted(daemon.target, tmp_path))
    assert state_of(daemon.target, tmp_path, SEND) is State.AWAITING_APPROVAL
    code = killed_in_child(approve_then_die, daemon.target, tmp_path)
    assert code == -signal.SIGKILL
    assert state_of(daemon.target, tmp_path, SEND) is State.PREPARED
    assert killed_in_child(approving_agent, daemon.target, tmp_path) == 0
    assert count(tmp_path, "send") == 1
    again = approving_agent(daemon.target, str(tmp_path))
    assert again == "model saw: sent to ann (#1)"
    assert (count(tmp_path, "lookup"), count(tmp_path, "send")) == (1, 1)


@pytest.mark.slow
def test_an_approved_call_killed_mid_effect_is_not_run_again(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Approved, resumed, killed inside the send after its effect: the
    RunState restored once more stops at ReconciliationNeeded; one send."""
    asyncio.run(interrupted(daemon.target, tmp_path))
    asyncio.run(decide(daemon.target, tmp_path, approve=True))
    (tmp_path / "crash-in-send").touch()
    code = killed_in_child(approving_agent, daemon.target, tmp_path)
    assert code == -signal.SIGKILL
    wait_unknown(daemon.target, tmp_path, SEND)
    with pytest.raises(LedgerInterruption) as stopped:
        approving_agent(daemon.target, str(tmp_path))
    assert isinstance(stopped.value.cause, ReconciliationNeeded)
    assert count(tmp_path, "send") == 1


@pytest.mark.slow
@pytest.mark.parametrize("at", list(CrashPoint))
def test_an_approved_send_killed_at_its_commit_is_never_sent_again(
    daemon: TestDaemon, tmp_path: Path, at: CrashPoint
) -> None:
    """Approved, then the resumed agent is killed at the send's commit (its
    first): before it, the RunState restored again stops at
    ReconciliationNeeded; after it, the model sees the stored result. One
    send either way."""
    asyncio.run(interrupted(daemon.target, tmp_path))
    asyncio.run(decide(daemon.target, tmp_path, approve=True))
    report = crash_and_resume(approving_agent, daemon.target, str(tmp_path), at=at)
    assert report.crashed, report
    if at is CrashPoint.BEFORE_COMMIT:
        assert isinstance(report.resumed_error, LedgerInterruption), report
        assert isinstance(report.resumed_error.cause, ReconciliationNeeded)
    else:
        assert report.resumed == "model saw: sent to ann (#1)", report
    assert count(tmp_path, "send") == 1


@pytest.mark.slow
def test_the_sdks_own_approval_runs_the_tool_twice_across_the_crash(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Negative control: the SDK alone, its approval saved in the RunState:
    the same kill and restore send twice."""
    assert plain_approving_agent(daemon.target, str(tmp_path)) == "interrupted"

    async def approve_in_state() -> None:
        agent = build(None, tmp_path, approval=True)
        saved = tmp_path / "state.json"
        state = await RunState.from_string(agent, saved.read_text())
        state.approve(state.get_interruptions()[0])
        saved.write_text(state.to_string())

    asyncio.run(approve_in_state())
    (tmp_path / "crash-in-send").touch()
    code = killed_in_child(plain_approving_agent, daemon.target, tmp_path)
    assert code == -signal.SIGKILL
    again = plain_approving_agent(daemon.target, str(tmp_path))
    assert again == "model saw: sent to ann (#2)"
    assert count(tmp_path, "send") == 2


def test_the_approval_does_not_carry_over_to_other_arguments(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Approved for Ann; the RunState is lost in a crash and the run starts
    again, its model now sending to Eve under the same call id: effectd
    refuses that call (INPUT_MISMATCH) and nothing is sent."""
    asyncio.run(interrupted(daemon.target, tmp_path))
    asyncio.run(decide(daemon.target, tmp_path, approve=True))
    (tmp_path / "state.json").unlink()
    with pytest.raises(LedgerInterruption) as stopped:
        asyncio.run(run_agent(daemon.target, tmp_path, approval=True, to="eve"))
    assert isinstance(stopped.value.cause, InputMismatch)
    assert count(tmp_path, "send") == 0
    assert state_of(daemon.target, tmp_path, SEND) is State.PREPARED


def test_an_approver_cannot_approve_arguments_effectd_did_not_record(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """The approval item shows Eve, effectd recorded Ann: refused, and the
    call still waits."""
    asyncio.run(interrupted(daemon.target, tmp_path))
    with pytest.raises(ApprovalMismatch):
        asyncio.run(decide(daemon.target, tmp_path, approve=True, to="eve"))
    assert state_of(daemon.target, tmp_path, SEND) is State.AWAITING_APPROVAL


def test_other_arguments_wait_for_their_own_approval(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Ann's send approved and done; in another run the model sends to Eve:
    that call waits for an approval of its own."""
    asyncio.run(interrupted(daemon.target, tmp_path))
    asyncio.run(decide(daemon.target, tmp_path, approve=True))
    assert (
        approving_agent(daemon.target, str(tmp_path)) == "model saw: sent to ann (#1)"
    )

    async def eve() -> str:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd)
            agent = build(ledger, tmp_path, approval=True, to="eve")
            with ledger.run(run_id(tmp_path) + "-eve"):
                result = await Runner.run(agent, "send Eve the itinerary")
            return result.interruptions[0].arguments or ""

    assert json.loads(asyncio.run(eve())) == {"to": "eve"}
    assert count(tmp_path, "send") == 1


def test_the_sdks_approval_alone_authorizes_nothing(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Approved in the RunState only (`RunState.approve`): the ledger still
    waits for its approver, so the run stops with ApprovalPending, unsent."""
    asyncio.run(interrupted(daemon.target, tmp_path))

    async def sdk_only() -> None:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd)
            agent = build(ledger, tmp_path, approval=True)
            state = await RunState.from_string(
                agent, (tmp_path / "state.json").read_text()
            )
            state.approve(state.get_interruptions()[0])
            with ledger.run(run_id(tmp_path)):
                await Runner.run(agent, state)

    with pytest.raises(LedgerInterruption) as stopped:
        asyncio.run(sdk_only())
    assert isinstance(stopped.value.cause, ApprovalPending)
    assert count(tmp_path, "send") == 0


def test_a_rejection_in_effectd_reaches_the_model(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Rejected by the approver: the restored run tells the model so, and
    the send never runs."""
    asyncio.run(interrupted(daemon.target, tmp_path))
    asyncio.run(decide(daemon.target, tmp_path, approve=False))
    result = approving_agent(daemon.target, str(tmp_path))
    assert result == f"model saw: {DEFAULT_REJECTION_MESSAGE}"
    assert count(tmp_path, "send") == 0


def predicate_agent(ledger: AgentLedger, workdir: Path, to: str) -> Agent[Any]:
    """`send` needs approval only for Eve (the tool's own predicate)."""

    async def for_eve(_ctx: Any, params: dict[str, Any], _call_id: str) -> bool:
        return params.get("to") == "eve"

    @function_tool(failure_error_function=None, needs_approval=for_eve)
    async def send(to: str) -> str:
        """Sends a message."""
        return f"sent to {to} (#{bump(workdir / 'send')})"

    def answer(call: ModelCall) -> Any:
        seen = outputs_of(call)
        if "c" not in seen:
            return [function_call("send", {"to": to}, call_id="c")]
        return [assistant_message(f"model saw: {seen['c']}")]

    model = ScriptedModel([ModelStep.respond(answer) for _ in range(3)])
    return Agent(name="m", model=model, tools=[ledger.tool(send)])


@pytest.mark.parametrize(("to", "held"), [("ann", False), ("eve", True)])
def test_the_tools_own_predicate_decides_which_calls_need_approval(
    daemon: TestDaemon, tmp_path: Path, to: str, held: bool
) -> None:
    """A per-call `needs_approval` predicate: Ann's send runs, Eve's waits in
    AWAITING_APPROVAL, unsent."""

    async def once() -> int:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd)
            with ledger.run(run_id(tmp_path)):
                result = await Runner.run(predicate_agent(ledger, tmp_path, to), "go")
            return len(result.interruptions)

    assert asyncio.run(once()) == int(held)
    expected = State.AWAITING_APPROVAL if held else State.COMMITTED
    assert state_of(daemon.target, tmp_path, "c") is expected
    assert count(tmp_path, "send") == int(not held)


def test_the_operators_tool_policy_gives_effects_and_approvals(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """The shared `ToolPolicy` (the TOML the other adapters read): `lookup`
    is recorded as a READ, and `send`, whose own `needs_approval` is False,
    waits for an approver, unsent."""
    policy = ToolPolicy.from_toml(
        '[tools.lookup]\neffect = "read"\n[tools.send]\nrequire_approval = true'
    )

    async def body() -> int:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd, policy=policy)
            lookup, send = tools(tmp_path, approval=False)
            agent = Agent(
                name="trip",
                model=model(),
                tools=[ledger.tool(lookup), ledger.tool(send)],
            )
            with ledger.run(run_id(tmp_path)):
                result = await Runner.run(agent, "send Ann the itinerary")
            return len(result.interruptions)

    assert asyncio.run(body()) == 1
    with Client(daemon.target) as client:
        looked = client.get_tool_call(run_id(tmp_path), LOOKUP)
        held = client.get_tool_call(run_id(tmp_path), SEND)
    assert (looked.effect, looked.state) == (Effect.READ, State.COMMITTED)
    assert (held.effect, held.state) == (Effect.SIDE_EFFECT, State.AWAITING_APPROVAL)
    assert count(tmp_path, "send") == 0


def test_arguments_no_predicate_can_read_are_approved_as_sent(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Arguments that are not a JSON object: the SDK asks for approval without
    asking the ledger. The approval records the call with exactly those
    arguments and approves it; resumed, the tool refuses them (a definite
    error, committed), and nothing is sent."""

    async def body() -> tuple[list[Any], str]:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd)
            agent = predicate_agent(ledger, tmp_path, "ann")
            odd = ModelStep(output=[function_call("send", '["eve"]', call_id="c")])
            agent.model = ScriptedModel([odd, [assistant_message("done")]])
            with ledger.run(run_id(tmp_path)):
                result = await Runner.run(agent, "go")
                state = result.to_state()
                waiting = await ledger.apply_decisions(state)
                (item,) = result.interruptions
                await ledger.approve(item, approver="ann", state=state)
                resumed = await Runner.run(agent, state)
            return waiting, str(resumed.final_output)

    waiting, final = asyncio.run(body())
    assert len(waiting) == 1
    assert final == "done"
    with Client(daemon.target) as client:
        call = client.get_tool_call(run_id(tmp_path), "c")
    assert call.state is State.COMMITTED
    assert call.result is not None
    assert not call.result.ok
    assert count(tmp_path, "send") == 0


# -- errors and misuse --------------------------------------------------------


def test_a_definite_error_is_committed_and_read_again(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """A tool that raises (not a timeout or a lost connection) ran and
    failed: the model reads the error, and a repeat reads the same error
    without running the tool again."""

    @function_tool(failure_error_function=None)
    async def send(to: str) -> str:
        """Sends a message."""
        bump(tmp_path / "send")
        raise ValueError(f"no mailbox {to}")

    async def once() -> str:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd)
            step = ModelStep(output=[function_call("send", {"to": "x"}, call_id="c")])

            def done(call: ModelCall) -> Any:
                return [assistant_message(outputs_of(call)["c"])]

            agent = Agent(
                name="m",
                model=ScriptedModel([step, ModelStep.respond(done)]),
                tools=[ledger.tool(send)],
            )
            with ledger.run(run_id(tmp_path)):
                return str((await Runner.run(agent, "go")).final_output)

    first, again = asyncio.run(once()), asyncio.run(once())
    assert first == again
    assert "no mailbox x" in first
    assert count(tmp_path, "send") == 1


def test_a_tool_past_its_timeout_is_unknown_and_never_rerun(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """The tool's `timeout_seconds` passes while it hangs after its effect:
    the ledger's deadline (not the SDK's, which would ask the model to try
    again) records UNKNOWN and interrupts the run; the run repeated stops at
    ReconciliationNeeded, and the effect happened once."""

    @function_tool(failure_error_function=None, timeout=0.5)
    async def send(to: str) -> str:
        """Sends a message, then hangs."""
        bump(tmp_path / "send")
        await asyncio.sleep(60)
        return f"sent to {to}"

    async def once() -> str:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd)
            step = ModelStep(output=[function_call("send", {"to": "x"}, call_id="c")])
            agent = Agent(
                name="m",
                model=ScriptedModel([step, [assistant_message("done")]]),
                tools=[ledger.tool(send)],
            )
            with ledger.run(run_id(tmp_path)):
                return str((await Runner.run(agent, "go")).final_output)

    with pytest.raises(LedgerInterruption) as stopped:
        asyncio.run(once())
    assert isinstance(stopped.value.cause, ToolTimedOut)
    assert state_of(daemon.target, tmp_path, "c") is State.UNKNOWN
    with pytest.raises(LedgerInterruption) as again:
        asyncio.run(once())
    assert isinstance(again.value.cause, ReconciliationNeeded)
    assert count(tmp_path, "send") == 1


def test_two_resumes_racing_run_the_tool_once(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Two processes resume the same run at once (here two runs in one loop):
    while the first one's send runs, the second meets CallInProgress and
    stops; the send ran once."""
    release = asyncio.Event()

    @function_tool(failure_error_function=None)
    async def send(to: str) -> str:
        """Sends a message, then waits to be released."""
        n = bump(tmp_path / "send")
        await release.wait()
        return f"sent to {to} (#{n})"

    async def once(effectd: AsyncClient) -> str:
        ledger = AgentLedger(effectd)
        step = ModelStep(output=[function_call("send", {"to": "x"}, call_id="c")])
        agent = Agent(
            name="m",
            model=ScriptedModel([step, [assistant_message("done")]]),
            tools=[ledger.tool(send)],
        )
        with ledger.run(run_id(tmp_path)):
            return str((await Runner.run(agent, "go")).final_output)

    async def race() -> tuple[str, BaseException | str]:
        async with AsyncClient(daemon.target) as effectd:
            first = asyncio.create_task(once(effectd))
            for _ in range(600):
                if count(tmp_path, "send") == 1:
                    break
                await asyncio.sleep(0.01)
            try:
                second: BaseException | str = await once(effectd)
            except LedgerInterruption as stopped:
                second = stopped
            release.set()
            return await first, second

    first, second = asyncio.run(race())
    assert first == "done"
    assert isinstance(second, LedgerInterruption)
    assert isinstance(second.cause, CallInProgress)
    assert count(tmp_path, "send") == 1


def test_a_call_outside_a_run_is_refused(daemon: TestDaemon, tmp_path: Path) -> None:
    """No run id, no call: never a made-up key."""

    async def body() -> None:
        async with AsyncClient(daemon.target) as effectd:
            agent = build(AgentLedger(effectd), tmp_path, approval=False)
            await Runner.run(agent, "go")

    with pytest.raises(Exception) as failed:  # noqa: PT011 (the SDK wraps it)
        asyncio.run(body())
    chain: BaseException | None = failed.value
    while chain is not None and not isinstance(chain, NoLedgerRun):
        chain = chain.__cause__ or chain.__context__
    assert isinstance(chain, NoLedgerRun)
    assert count(tmp_path, "lookup") == 0


# -- parallel calls of one step ------------------------------------------------


def parallel_agent(ledger: AgentLedger, workdir: Path) -> Agent[Any]:
    """Sends to Ann and to Bo in one model response, then says what it saw."""
    _, send = tools(workdir, approval=False)

    def answer(call: ModelCall) -> Any:
        seen = outputs_of(call)
        if not seen:
            return [
                function_call("send", {"to": "ann"}, call_id="p-1"),
                function_call("send", {"to": "bo"}, call_id="p-2"),
            ]
        return [assistant_message(f"model saw: {seen['p-1']} | {seen['p-2']}")]

    model = ScriptedModel([ModelStep.respond(answer) for _ in range(4)])
    return Agent(name="trip", model=model, tools=[ledger.tool(send)])


def test_parallel_unknown_calls_are_all_named_by_the_interruption(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Both parallel sends of a step are UNKNOWN (their process died): the
    interruption names both, so the operator reconciles both and one restart
    finishes, unsent (issue 25 item 6: fails before the fix: it named one,
    and each call took a reconcile-and-restart round)."""
    run = run_id(tmp_path)
    with Client(daemon.target) as client:
        for call_id, to in (("p-1", "ann"), ("p-2", "bo")):
            held = client.prepare_tool(run, call_id, "send", {"to": to}, start=True)
            client.report_unknown(run, call_id, held.call.attempt, "the process died")

    async def restart() -> str:
        async with AsyncClient(daemon.target) as effectd:
            ledger = AgentLedger(effectd, lease_ms=LEASE_MS)
            with ledger.run(run):
                result = await Runner.run(parallel_agent(ledger, tmp_path), "send")
                return str(result.final_output)

    with pytest.raises(LedgerInterruption) as stopped:
        asyncio.run(restart())
    assert isinstance(stopped.value.cause, ReconciliationNeeded)
    named: tuple[ToolCall, ...] = stopped.value.calls
    assert sorted(c.call_id for c in named) == ["p-1", "p-2"]
    assert "p-1 (send, UNKNOWN), p-2 (send, UNKNOWN)" in str(stopped.value)
    with Client(daemon.target) as client:
        for call in named:
            client.reconcile(
                run,
                call.call_id,
                expected_revision=client.get_tool_call(run, call.call_id).revision,
                operator="olga",
                reason="found it",
                evidence="outbox",
                result=f"sent ({call.call_id})",
            )
    assert asyncio.run(restart()) == "model saw: sent (p-1) | sent (p-2)"
    assert count(tmp_path, "send") == 0


# -- MCP servers ----------------------------------------------------------------


def mcp_agent(tools: list[Any], tool: str, call_id: str = "m-1") -> Agent[Any]:
    """Calls the MCP tool `tool` once (call id m-1), then says what it got;
    each answer follows from the transcript, as `model` does."""

    def answer(call: ModelCall) -> Any:
        seen = outputs_of(call)
        if call_id not in seen:
            return [function_call(tool, {"to": "ann"}, call_id=call_id)]
        return [assistant_message(f"model saw: {seen[call_id]}")]

    model = ScriptedModel([ModelStep.respond(answer) for _ in range(4)])
    return Agent(name="mailer", model=model, tools=tools)


def stdio_params(state: Path) -> MCPServerStdioParams:
    return {"command": sys.executable, "args": [str(SERVER), str(state), "stdio"]}


async def run_mcp(
    target: str, state: Path, tool: str, *, ledgered: bool = True, call_id: str = "m-1"
) -> str:
    params = stdio_params(state)
    async with (
        AsyncClient(target) as effectd,
        MCPServerStdio(params=params, max_retry_attempts=0) as server,
    ):
        ledger = AgentLedger(effectd)
        if ledgered:
            tools: list[Any] = await ledger.mcp_tools(server, name="counter")
            agent = mcp_agent(tools, tool, call_id)
        else:
            agent = mcp_agent([], tool)
            agent.mcp_servers = [server]
        with ledger.run(run_id(state)):
            return str((await Runner.run(agent, "mail Ann")).final_output)


@pytest.mark.slow
def test_an_mcp_call_repeated_is_answered_from_the_ledger(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """An MCP tool (the `mcp` package's server over stdio, through the SDK's
    MCPServerStdio) called by the same run twice: the server runs it once,
    recorded as mcp://counter/send on channel MCP."""
    first = asyncio.run(run_mcp(daemon.target, tmp_path, "send"))
    again = asyncio.run(run_mcp(daemon.target, tmp_path, "send"))
    assert first == again
    assert "sent to ann (#1)" in first
    assert executions(tmp_path, "send") == 1
    with Client(daemon.target) as client:
        call = client.get_tool_call(run_id(tmp_path), "m-1")
    assert (call.tool_name, call.channel) == ("mcp://counter/send", Channel.MCP)


@pytest.mark.slow
def test_the_sdks_own_mcp_path_runs_the_call_twice(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """Negative control: the agent given the server itself (`mcp_servers`)
    sends again when the run is repeated."""
    asyncio.run(run_mcp(daemon.target, tmp_path, "send", ledgered=False))
    asyncio.run(run_mcp(daemon.target, tmp_path, "send", ledgered=False))
    assert executions(tmp_path, "send") == 2


@pytest.mark.slow
def test_an_mcp_server_killed_mid_call_is_never_called_again(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """The server dies while its tool runs: the run stops (UNKNOWN recorded),
    and the run repeated stops at ReconciliationNeeded; one execution."""
    (tmp_path / "hold").touch()

    async def kill_mid_call() -> None:
        run = asyncio.create_task(run_mcp(daemon.target, tmp_path, "slow_send"))
        for _ in range(600):
            if executions(tmp_path, "slow_send") == 1 or run.done():
                break
            await asyncio.sleep(0.05)
        kill_server(tmp_path)
        await run

    with pytest.raises(LedgerInterruption):
        asyncio.run(kill_mid_call())
    assert state_of(daemon.target, tmp_path, "m-1") is State.UNKNOWN
    (tmp_path / "hold").unlink()
    with pytest.raises(LedgerInterruption) as stopped:
        asyncio.run(run_mcp(daemon.target, tmp_path, "slow_send"))
    assert isinstance(stopped.value.cause, ReconciliationNeeded)
    assert executions(tmp_path, "slow_send") == 1


@pytest.mark.slow
def test_an_mcp_tool_the_policy_holds_for_approval_runs_once_approved(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """The operator's policy requires approval of `send`: the SDK interrupts,
    the server is not called; approved in effectd, the RunState restored on
    a new connection sends once, and restored again replays."""
    policy = McpPolicy.from_toml(
        '[servers.counter.tools.send]\neffect = "side-effect"\n'
        "require_approval = true\n"
    )

    async def step(approve: bool) -> str:
        async with (
            AsyncClient(daemon.target) as effectd,
            MCPServerStdio(params=stdio_params(tmp_path)) as server,
        ):
            ledger = AgentLedger(effectd)
            tools = await ledger.mcp_tools(server, name="counter", policy=policy)
            agent = mcp_agent(list(tools), "send")
            saved = tmp_path / "state.json"
            with ledger.run(run_id(tmp_path)):
                if not saved.exists():
                    result = await Runner.run(agent, "mail Ann")
                    saved.write_text(result.to_state().to_string())
                    (item,) = result.interruptions
                    if approve:
                        await ledger.approve(item, approver="ann")
                    return "interrupted"
                state = await RunState.from_string(agent, saved.read_text())
                assert await ledger.apply_decisions(state) == []
                return str((await Runner.run(agent, state)).final_output)

    assert asyncio.run(step(approve=True)) == "interrupted"
    assert executions(tmp_path, "send") == 0
    first = asyncio.run(step(approve=False))
    again = asyncio.run(step(approve=False))
    assert first == again
    assert "sent to ann (#1)" in first
    assert executions(tmp_path, "send") == 1


@pytest.mark.slow
def test_an_mcp_calls_result_is_a_call_tool_result_in_the_ledger_and_back(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """An MCP tool's output is stored as the CallToolResult it came from (the
    shape the daemon lets an operator reconcile an MCP call with); a call
    reconciled with one reaches the model as a live result would, the server never
    called (issue 25 item 5: fails before the fix: the SDK's own output was
    stored, and a reconciled CallToolResult reached the model as a dump)."""
    first = asyncio.run(run_mcp(daemon.target, tmp_path, "send"))
    run = run_id(tmp_path)
    with Client(daemon.target) as client:
        call = client.get_tool_call(run, "m-1")
        assert call.result is not None
        assert call.result.value == {
            "content": [{"type": "text", "text": "sent to ann (#1)"}],
            "isError": False,
        }
        held = client.prepare_tool(
            run,
            "m-2",
            "mcp://counter/send",
            {"server": "counter", "tool": "send", "arguments": {"to": "ann"}},
            start=True,
            channel=Channel.MCP,
        )
        client.report_unknown(run, "m-2", held.call.attempt, "the process died")
        client.reconcile(
            run,
            "m-2",
            expected_revision=client.get_tool_call(run, "m-2").revision,
            operator="olga",
            reason="found it",
            evidence="outbox",
            result={"content": [{"type": "text", "text": "charged i-9"}]},
        )
    answer = asyncio.run(run_mcp(daemon.target, tmp_path, "send", call_id="m-2"))
    # As the model sees a live result of the tool.
    assert answer == first.replace("sent to ann (#1)", "charged i-9")
    assert executions(tmp_path, "send") == 1


def test_an_mcp_server_that_retries_calls_is_refused(
    daemon: TestDaemon, tmp_path: Path
) -> None:
    """A server created with max_retry_attempts would send a failed call
    again: the ledger does not wrap it."""

    async def body() -> None:
        async with AsyncClient(daemon.target) as effectd:
            server = MCPServerStdio(params=stdio_params(tmp_path), max_retry_attempts=2)
            await AgentLedger(effectd).mcp_tools(server, name="counter")

    with pytest.raises(ValueError, match="max_retry_attempts"):
        asyncio.run(body())


def test_importing_the_client_does_not_import_the_sdk() -> None:
    """The extra is imported only by `effectd_client.contrib.openai_agents`."""
    assert imported_by("import effectd_client", ["agents"]) == []
