"""effectd_client.contrib.langgraph: a real LangGraph agent (StateGraph, ToolNode, a
SQLite checkpointer) against a real daemon; the agent process is killed in
the middle of its side-effecting tool and the thread resumed from its
checkpoint: the tool acts at most once, a committed result is replayed, an
unknown outcome is an interrupt, and approvals hold for their arguments only.
`book`'s external counter is `tests.clients.lg.agent.effects`."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

import effectd_client.contrib.langgraph
from effectd_client import (
    AsyncClient,
    Client,
    Effect,
    InputMismatch,
    State,
    current_call,
)
from effectd_client.contrib.langgraph import (
    TOOL_ERROR,
    DurabilityError,
    LedgeredToolCalls,
    ToolPolicy,
    approve,
    reject,
    retry,
    thread_run_id,
)
from effectd_client.contrib.langgraph._parts import GraphToolCall, restored
from effectd_client.testing import (
    CrashPoint,
    TestDaemon,
    crash_and_resume,
    running_daemon,
)
from tests.clients.lg import agent as lg
from tests.support.imports import imported_by

ROOT = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 60.0


@pytest.fixture(scope="module")
def effectd() -> Iterator[TestDaemon]:
    """One real daemon (real clock: a crashed call's lease runs out) for the
    module; each test has threads of its own."""
    with running_daemon() as daemon:
        yield daemon


@pytest.fixture
def workdir(short_tmp: Path) -> Path:
    return short_tmp


@pytest.fixture
def client(effectd: TestDaemon) -> Iterator[Client]:
    with Client(effectd.target) as c:
        yield c


def check_at_most_once(workdir: Path) -> None:
    """The property: `book` acted at most once, whatever crashed."""
    n = lg.effects(workdir)
    if n > 1:
        raise AssertionError(f"book acted {n} times")


def kill_mid_tool(
    target: str, workdir: Path, thread: str, mode: str = "ledgered"
) -> None:
    """Runs the agent in a process of its own and SIGKILLs it while `book`
    runs, after its effect and before anything records it."""
    (workdir / "hold").touch()
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.clients.lg.agent",
            target,
            str(workdir),
            thread,
            mode,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not (workdir / "reached").exists():
            assert child.poll() is None, "the agent ended before its tool"
            assert time.monotonic() < deadline, "the tool was not reached"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    (workdir / "hold").unlink()


def run_child(target: str, workdir: Path, thread: str, **env: str) -> int:
    """The agent in a process of its own; its exit code (-9: killed)."""
    child = subprocess.run(
        [sys.executable, "-m", "tests.clients.lg.agent", target, str(workdir), thread],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=WAIT_SECONDS,
        check=False,
    )
    return child.returncode


def test_a_run_calls_each_tool_once_and_a_rerun_replays_them(
    effectd: TestDaemon, workdir: Path
) -> None:
    """The agent books and searches; the same thread from the start again
    (a fresh checkpointer) gets the stored results: `book` acted once."""
    first = lg.run(effectd.target, workdir, "t-plain")
    assert first["final"] == "done: booked Paris (#1) | 3 results for Paris hotels"
    (workdir / "checkpoints.sqlite").unlink()
    again = lg.run(effectd.target, workdir, "t-plain")
    assert again == first
    assert lg.effects(workdir) == 1
    with Client(effectd.target) as c:
        book = c.get_tool_call("t-plain", "call-book-1")
        search = c.get_tool_call("t-plain", "call-search-1")
    assert (book.state, book.effect) == (State.COMMITTED, Effect.SIDE_EFFECT)
    assert (search.tool_name, search.effect) == ("search", Effect.READ)


@pytest.mark.slow
def test_a_crash_after_the_commit_replays_the_result(
    effectd: TestDaemon, workdir: Path
) -> None:
    """Killed right after `book`'s result is committed, before the graph
    checkpoints it: the resumed thread re-runs the tools node, and the model
    sees the stored result; `book` acted once."""
    report = crash_and_resume(
        lg.agent, effectd.target, str(workdir), "t-commit", at=CrashPoint.AFTER_COMMIT
    )
    assert report.crashed
    assert report.resumed_error is None, report.resumed_error
    assert report.resumed["final"].startswith("done: booked Paris (#1) |")
    check_at_most_once(workdir)
    assert lg.effects(workdir) == 1


@pytest.mark.slow
def test_a_crash_before_the_commit_is_an_interrupt(
    effectd: TestDaemon, workdir: Path
) -> None:
    """Killed after `book` acted, as its commit is sent (`crash_and_resume`):
    the resumed thread interrupts to reconcile; `book` acted once."""
    report = crash_and_resume(
        lg.agent, effectd.target, str(workdir), "t-before", at=CrashPoint.BEFORE_COMMIT
    )
    assert report.crashed
    assert report.resumed_error is None, report.resumed_error
    [asked] = report.resumed["interrupts"]
    assert (asked["effectd"], asked["tool"]) == ("reconcile", "book")
    assert lg.effects(workdir) == 1


@pytest.mark.slow
def test_a_crash_mid_tool_is_an_interrupt_never_a_second_run(
    effectd: TestDaemon, workdir: Path
) -> None:
    """Killed inside `book`, after its effect: the resumed thread stops at an
    interrupt asking to reconcile, however often it is resumed; once an
    operator records what happened, the model gets that result; `book`
    acted once."""
    kill_mid_tool(effectd.target, workdir, "t-mid")
    assert lg.effects(workdir) == 1
    for _ in range(2):
        resumed = lg.run(effectd.target, workdir, "t-mid")
        [asked] = resumed["interrupts"]
        assert (asked["effectd"], asked["call_id"]) == ("reconcile", "call-book-1")
        assert asked["arguments"] == {"city": "Paris"}
        check_at_most_once(workdir)
    with Client(effectd.target) as c:
        call = c.get_tool_call("t-mid", "call-book-1")
        assert call.state is State.UNKNOWN
        c.reconcile(
            "t-mid",
            "call-book-1",
            expected_revision=call.revision,
            operator="oscar",
            reason="found the booking",
            evidence="hotel confirmation 42",
            result={"content": "booked Paris (confirmation 42)"},
        )
    done = lg.run(effectd.target, workdir, "t-mid", resume="reconciled")
    assert done["final"].startswith("done: booked Paris (confirmation 42) |")
    assert lg.effects(workdir) == 1


@pytest.mark.slow
def test_negative_control_a_plain_tool_node_runs_the_tool_twice(
    effectd: TestDaemon, workdir: Path
) -> None:
    """The same crash without the wrapper: LangGraph resumes the tools node
    from its start and `book` acts again; the property check catches it."""
    kill_mid_tool(effectd.target, workdir, "t-control", mode="plain")
    lg.run(effectd.target, workdir, "t-control", ledgered=False)
    assert lg.effects(workdir) == 2
    with pytest.raises(AssertionError, match="book acted 2 times"):
        check_at_most_once(workdir)


@pytest.mark.slow
def test_an_approval_given_before_a_crash_holds_after_resume(
    effectd: TestDaemon, workdir: Path
) -> None:
    """The approval interrupt is answered with `approve()`; the process dies
    right after effectd records it, before the tool runs; the resumed thread
    runs `book` once, without asking again."""
    asked = lg.run(effectd.target, workdir, "t-approve", policy=lg.APPROVAL_POLICY)
    [request] = asked["interrupts"]
    assert (request["effectd"], request["state"]) == ("approval", "AWAITING_APPROVAL")
    assert lg.effects(workdir) == 0
    answer = approve(request, approver="ann", reason="within budget")
    code = run_child(
        effectd.target,
        workdir,
        "t-approve",
        RESUME=json.dumps(answer),
        POLICY=lg.APPROVAL_POLICY,
        CRASH_AFTER_APPROVAL="1",
    )
    assert code == -signal.SIGKILL
    assert lg.effects(workdir) == 0
    done = lg.run(effectd.target, workdir, "t-approve", policy=lg.APPROVAL_POLICY)
    assert done["interrupts"] == []
    assert done["final"].startswith("done: booked Paris (#1) |")
    assert lg.effects(workdir) == 1
    with Client(effectd.target) as c:
        call = c.get_tool_call("t-approve", "call-book-1")
    # Approved once, started once.
    assert call.history == ("prepare", "approve", "start", "commit", "acknowledge")


def test_an_approval_covers_only_its_own_call_and_arguments(
    effectd: TestDaemon, client: Client, workdir: Path
) -> None:
    """An answer approving one thread's call does not approve another's
    (other arguments): the thread asks again, saying why; a call approved in
    effectd and then asked for with other arguments under its call id is
    refused, never run; the approved call itself runs once."""
    ann = lg.run(effectd.target, workdir, "t-ann", policy=lg.APPROVAL_POLICY)
    answer = approve(ann["interrupts"][0], approver="ann")
    mallory = ledgered_graph(client, workdir, MALLORY)
    config: Any = {"configurable": {"thread_id": "t-mallory"}}
    asked = mallory.invoke(START_INPUT, config, durability="sync")
    assert asked["__interrupt__"][0].value["arguments"] == {"city": "Mallory"}
    forged = {**answer, "run_id": "t-mallory"}
    again = mallory.invoke(Command(resume=forged), config, durability="sync")
    assert "about other arguments" in again["__interrupt__"][0].value["refused"]
    client.decide_approval(  # an approver decides in effectd
        "t-ann",
        "call-book-1",
        approve=True,
        approver="ann",
        reason="ok",
        expected_revision=answer["revision"],
        input_fingerprint=answer["input_fingerprint"],
    )
    again = ledgered_graph(client, workdir, MALLORY)  # same thread, other args
    with pytest.raises(InputMismatch):
        again.invoke(
            START_INPUT, {"configurable": {"thread_id": "t-ann"}}, durability="sync"
        )
    assert lg.effects(workdir) == 0
    done = lg.run(effectd.target, workdir, "t-ann", policy=lg.APPROVAL_POLICY)
    assert done["final"].startswith("done: booked Paris (#1) |")
    assert lg.effects(workdir) == 1


def test_an_approval_of_edited_arguments_is_refused(
    client: Client, workdir: Path
) -> None:
    """An interrupt whose shown `arguments` were edited (a human-in-the-loop
    "edit"), then approved: refused, never run, since effectd would run the
    arguments it recorded, not the ones shown; the thread asks again, saying
    why, and the interrupt approved as raised runs once (issue 25 item 4:
    fails before the fix: approved, and `book` ran for Paris while Rome was
    shown)."""
    graph = ledgered_graph(client, workdir)
    config = thread("t-edited")
    asked = graph.invoke(START_INPUT, config, durability="sync")
    request = asked["__interrupt__"][0].value
    edited = {**request, "arguments": {"city": "Rome"}}
    again = graph.invoke(
        Command(resume=approve(edited, approver="ann")), config, durability="sync"
    )
    assert lg.effects(workdir) == 0
    call = client.get_tool_call("t-edited", "call-book-1")
    assert call.state is State.AWAITING_APPROVAL
    [asked_again] = [i.value for i in again["__interrupt__"]]
    assert "shows other arguments ({'city': 'Rome'})" in asked_again["refused"]
    assert asked_again["arguments"] == {"city": "Paris"}
    done = graph.invoke(
        Command(resume=approve(asked_again, approver="ann")), config, durability="sync"
    )
    assert done["messages"][-1].content.startswith("done: booked Paris (#1) |")
    assert lg.effects(workdir) == 1


def test_a_rejected_call_is_an_error_result_for_the_model(
    effectd: TestDaemon, workdir: Path
) -> None:
    """`reject()` as the resume value: the tool never runs; the model reads
    the approver's reason as an error ToolMessage."""
    asked = lg.run(effectd.target, workdir, "t-reject", policy=lg.APPROVAL_POLICY)
    no = reject(asked["interrupts"][0], approver="ann", reason="too expensive")
    done = lg.run(
        effectd.target, workdir, "t-reject", policy=lg.APPROVAL_POLICY, resume=no
    )
    assert done["tools"][0] == (
        "call-book-1",
        "the tool was not run: rejected by ann: too expensive",
        "error",
    )
    assert lg.effects(workdir) == 0


START_INPUT = {"messages": [HumanMessage("book a room")]}
MALLORY = ({**lg.SCRIPT[0], "args": {"city": "Mallory"}}, *lg.SCRIPT[1:])


def ledgered_graph(
    client: Client | AsyncClient,
    workdir: Path,
    script: Any = lg.SCRIPT,
    *,
    policy: str = lg.APPROVAL_POLICY,
    **options: Any,
) -> Any:
    """The agent's graph with its own script, checkpointed in memory."""
    ledger = LedgeredToolCalls(client, policy=ToolPolicy.from_toml(policy), **options)
    return lg.build(InMemorySaver(), ledger.tool_node(lg.tools(workdir)), script)


def one_call(name: str, call_id: str = "c-1", **args: Any) -> tuple[dict[str, Any]]:
    return ({"name": name, "args": args, "id": call_id},)


def graph_of(
    client: Client | AsyncClient,
    tools: list[Any],
    script: Any,
    policy: str = "",
    **node_options: Any,
) -> Any:
    ledger = LedgeredToolCalls(client, policy=ToolPolicy.from_toml(policy))
    return lg.build(InMemorySaver(), ledger.tool_node(tools, **node_options), script)


def thread(name: str) -> Any:
    return {"configurable": {"thread_id": name}}


def test_a_graph_without_sync_durability_is_refused_before_any_tool_runs(
    client: Client, workdir: Path
) -> None:
    """With durability "async" or "exit" the model's tool calls may not be
    checkpointed before they run (a crash would have the model name them
    anew): the wrapper refuses, and `book` never acts."""
    graph = ledgered_graph(client, workdir, policy=lg.POLICY)
    for durability in ("async", "exit"):
        with pytest.raises(DurabilityError, match=durability):
            graph.invoke(START_INPUT, thread(f"t-{durability}"), durability=durability)
    assert lg.effects(workdir) == 0


def test_an_error_tool_message_is_committed_and_replayed(client: Client) -> None:
    """A tool whose failure ToolNode turns into an error ToolMessage ran: the
    message is committed as an error result and replayed, not run again."""
    runs: list[str] = []

    @tool
    def charge(amount: int) -> str:
        """Charges (fails after acting)."""
        runs.append("charge")
        raise ValueError(f"card declined for {amount}")

    script = one_call("charge", amount=5)
    seen: list[tuple[str, Any, str]] = []
    for _ in range(2):  # the second graph starts the thread from scratch
        graph = graph_of(client, [charge], script, handle_tool_errors=True)
        out = graph.invoke(START_INPUT, thread("t-error"), durability="sync")
        [message] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        seen.append((message.tool_call_id, message.content, message.status))
    assert seen[0] == seen[1]
    assert seen[0][2] == "error"
    assert "card declined for 5" in str(seen[0][1])
    assert runs == ["charge"]
    record = client.get_tool_call("t-error", "c-1")
    assert record.result is not None
    assert record.result.error_code == TOOL_ERROR


def test_a_tool_returning_a_command_is_replayed_whole(client: Client) -> None:
    """A tool's `Command` (a state update) is stored whole and replayed."""
    runs: list[str] = []

    @tool
    def note(text: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
        """Notes (returns a state update)."""
        runs.append(text)
        message = ToolMessage(f"noted {text}", tool_call_id=tool_call_id)
        return Command(update={"messages": [message]})

    outs = []
    for _ in range(2):
        graph = graph_of(client, [note], one_call("note", text="hi"))
        out = graph.invoke(START_INPUT, thread("t-command"), durability="sync")
        outs.append(out["messages"][-1].content)
    assert outs == ["done: noted hi", "done: noted hi"]
    assert runs == ["hi"]


def lookup_timing_out_once(runs: list[str]) -> Any:
    """A `lookup` tool that notes each run in `runs` and times out (outcome
    unknown) the first time."""

    @tool
    def lookup(q: str) -> str:
        """Looks up (times out the first time)."""
        runs.append(q)
        if len(runs) == 1:
            raise TimeoutError("the upstream did not answer")
        return f"found {q}"

    return lookup


def test_a_read_of_unknown_outcome_asks_before_it_runs_again(client: Client) -> None:
    """A READ tool that timed out (outcome unknown) is not run again by a
    resumed graph until the human answers the retry interrupt with `retry()`."""
    runs: list[str] = []
    lookup = lookup_timing_out_once(runs)
    graph = graph_of(
        client, [lookup], one_call("lookup", q="x"), '[tools.lookup]\neffect = "read"'
    )
    config = thread("t-retry")
    with pytest.raises(TimeoutError):
        graph.invoke(START_INPUT, config, durability="sync")
    asked = graph.invoke(None, config, durability="sync")
    [request] = [i.value for i in asked["__interrupt__"]]
    assert (request["effectd"], request["effect"]) == ("retry", "READ")
    assert runs == ["x"]
    done = graph.invoke(Command(resume=retry(request)), config, durability="sync")
    assert done["messages"][-1].content == "done: found x"
    assert runs == ["x", "x"]


@pytest.mark.parametrize("effect", ["read", "side-effect"])
def test_a_rule_that_retries_unknown_outcomes_runs_a_read_again_without_asking(
    client: Client, effect: str
) -> None:
    """`retry_unknown = true` in the tool's rule: a READ of unknown outcome
    runs again when the graph resumes, with no interrupt; a SIDE_EFFECT with
    the same rule is still never run again (an operator reconciles it)."""
    runs: list[str] = []
    lookup = lookup_timing_out_once(runs)
    rule = f'[tools.lookup]\neffect = "{effect}"\nretry_unknown = true'
    graph = graph_of(client, [lookup], one_call("lookup", q="x"), rule)
    config = thread(f"t-auto-retry-{effect}")
    with pytest.raises(TimeoutError):
        graph.invoke(START_INPUT, config, durability="sync")
    resumed = graph.invoke(None, config, durability="sync")
    if effect == "read":
        assert "__interrupt__" not in resumed
        assert resumed["messages"][-1].content == "done: found x"
        assert runs == ["x", "x"]
    else:
        [request] = [i.value for i in resumed["__interrupt__"]]
        assert request["effectd"] == "reconcile"
        assert runs == ["x"]


def test_an_async_graph_goes_through_the_ledger_too(
    effectd: TestDaemon, workdir: Path
) -> None:
    """With an AsyncClient the graph runs with `ainvoke` through the ledger,
    and a sync `invoke` is refused rather than run without it."""

    async def main() -> list[Any]:
        async with AsyncClient(effectd.target) as aclient:
            outs = []
            for _ in range(2):
                graph = ledgered_graph(aclient, workdir, policy=lg.POLICY)
                out = await graph.ainvoke(
                    START_INPUT, thread("t-async"), durability="sync"
                )
                outs.append(out["messages"][-1].content)
            with pytest.raises(TypeError, match="ainvoke"):
                graph.invoke(START_INPUT, thread("t-async-2"), durability="sync")
            return outs

    outs = asyncio.run(main())
    assert outs[0] == outs[1]
    assert outs[0].startswith("done: booked Paris (#1) |")
    assert lg.effects(workdir) == 1


def test_the_langgraph_extra_brings_the_sqlite_checkpointer() -> None:
    """`pip install effectd-client[langgraph]` installs `SqliteSaver`, the
    durable checkpointer the docs compile with, pinned at the release tested
    here beside the pinned LangGraph (issue 25 item 15: fails before the
    fix: the extra held LangGraph alone)."""
    project = tomllib.loads((ROOT / "clients/python/pyproject.toml").read_text())
    extra = project["project"]["optional-dependencies"]["langgraph"]
    pins = dict(requirement.split("==") for requirement in extra)
    for package in ("langgraph", "langgraph-checkpoint-sqlite"):
        assert pins.get(package) == importlib.metadata.version(package), package


def test_importing_the_client_does_not_import_langgraph() -> None:
    """The extra is imported only by `effectd_client.contrib.langgraph`."""
    probe = "import effectd_client, effectd_client.testing"
    assert imported_by(probe, ["langgraph", "langchain_core"]) == []


def test_the_public_names_are_pinned() -> None:
    """`effectd_client.contrib.langgraph.__all__` is exactly the documented names."""
    assert set(effectd_client.contrib.langgraph.__all__) == {
        "KIND",
        "TOOL_ERROR",
        "ApprovalMismatch",
        "DurabilityError",
        "LedgeredToolCalls",
        "PolicyError",
        "ToolDecision",
        "ToolPolicy",
        "ToolRule",
        "approve",
        "reject",
        "retry",
        "thread_run_id",
    }
    for name in effectd_client.contrib.langgraph.__all__:
        assert getattr(effectd_client.contrib.langgraph, name) is not None


def hold_call(client: Client, run_id: str, lease_ms: int) -> None:
    """Another attempt (a process that died) holds `book`'s call with a lease."""
    held = client.prepare_tool(
        run_id,
        "call-book-1",
        "book",
        {"city": "Paris"},
        effect=Effect.SIDE_EFFECT,
        start=True,
        lease_ms=lease_ms,
    )
    assert held.attempt_held


def test_a_call_another_attempt_holds_waits_for_its_lease_then_interrupts(
    client: Client, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resumed graph meets a call whose crashed attempt still holds its
    lease: it waits for the lease to run out, however few interrupts a node
    may be resumed from, then asks to reconcile; `book` never runs here."""
    monkeypatch.setattr(effectd_client.contrib.langgraph, "MAX_ROUNDS", 1)
    hold_call(client, "t-held", lease_ms=1500)
    graph = ledgered_graph(client, workdir, policy=lg.POLICY)
    asked = graph.invoke(START_INPUT, thread("t-held"), durability="sync")
    assert asked["__interrupt__"][0].value["effectd"] == "reconcile"
    assert lg.effects(workdir) == 0


def test_a_call_held_longer_than_the_wait_is_an_interrupt_not_a_run(
    client: Client, workdir: Path
) -> None:
    """Past `in_progress_wait` the call interrupts (an error result would
    have the model call the tool anew); resumed, it waits again; unrun."""
    hold_call(client, "t-held-long", lease_ms=60_000)
    graph = ledgered_graph(client, workdir, policy=lg.POLICY, in_progress_wait=0.3)
    config = thread("t-held-long")
    asked = graph.invoke(START_INPUT, config, durability="sync")
    assert asked["__interrupt__"][0].value["effectd"] == "in_progress"
    again = graph.invoke(Command(resume="look again"), config, durability="sync")
    assert again["__interrupt__"][0].value["effectd"] == "in_progress"
    assert lg.effects(workdir) == 0
    assert client.get_tool_call("t-held-long", "call-book-1").attempt == 1


# One model message with two calls: `book`, and `pay` (which waits for a
# human); then the final answer.
PARALLEL = (
    [
        {"name": "book", "args": {"city": "Paris"}, "id": "call-book-1"},
        {"name": "pay", "args": {"amount": 10}, "id": "call-pay-1"},
    ],
)


@pytest.mark.parametrize("ledgered", [True, False], ids=["ledgered", "plain"])
def test_a_sibling_of_an_interrupted_call_is_replayed_not_run_again(
    client: Client, workdir: Path, ledgered: bool
) -> None:
    """LangGraph runs an interrupted tools node again from its start: `book`,
    which ran beside `pay` (interrupted for a human), runs again on resume
    in a plain ToolNode (the negative control, caught here), and is replayed
    from the ledger in a wrapped one."""
    paid: list[int] = []

    @tool
    def pay(amount: int) -> str:
        """Pays (asks a human first when not wrapped)."""
        if not ledgered:
            interrupt({"pay": amount})
        paid.append(amount)
        return f"paid {amount}"

    tools = [*lg.tools(workdir), pay]
    policy = (
        '[tools.pay]\nrequire_approval = true\n[tools.book]\neffect = "side-effect"'
    )
    if ledgered:
        node = LedgeredToolCalls(client, policy=ToolPolicy.from_toml(policy)).tool_node(
            tools
        )
    else:
        node = ToolNode(tools)
    graph = lg.build(InMemorySaver(), node, PARALLEL)
    config = thread(f"t-siblings-{ledgered}")
    asked = graph.invoke(START_INPUT, config, durability="sync")
    [request] = [i.value for i in asked["__interrupt__"]]
    answer = approve(request, approver="ann") if ledgered else "yes"
    done = graph.invoke(Command(resume=answer), config, durability="sync")
    assert paid == [10]
    if ledgered:
        assert done["messages"][-1].content == "done: booked Paris (#1) | paid 10"
        check_at_most_once(workdir)
    else:
        with pytest.raises(AssertionError, match="book acted 2 times"):
            check_at_most_once(workdir)


# One model message with two calls of `book`; then the final answer.
TWO_BOOKINGS = (
    [
        {"name": "book", "args": {"city": "Paris"}, "id": "call-book-1"},
        {"name": "book", "args": {"city": "Rome"}, "id": "call-book-2"},
    ],
)


def unknown_call(
    client: Client, run_id: str, call_id: str, tool: str, args: dict[str, Any]
) -> None:
    """A call of a process that died mid-tool: UNKNOWN."""
    effect = Effect.READ if tool == "search" else Effect.SIDE_EFFECT
    held = client.prepare_tool(run_id, call_id, tool, args, effect=effect, start=True)
    client.report_unknown(run_id, call_id, held.call.attempt, "the process died")


def named(interrupts: Any) -> list[tuple[str, str]]:
    """The calls the node's interrupt asks a human about, with their kind."""
    [value] = [i.value for i in interrupts]
    return [(c["call_id"], c["effectd"]) for c in value.get("calls", [value])]


def test_parallel_unknown_calls_are_reconciled_in_one_round(
    client: Client, workdir: Path
) -> None:
    """Two parallel calls of a step both UNKNOWN: the one interrupt names
    both, so the operator reconciles both and one resume finishes (issue 25
    item 6: fails before the fix: one call per interrupt, a round each)."""
    for call_id, city in (("call-book-1", "Paris"), ("call-book-2", "Rome")):
        unknown_call(client, "t-two-unknown", call_id, "book", {"city": city})
    graph = ledgered_graph(client, workdir, TWO_BOOKINGS, policy=lg.POLICY)
    config = thread("t-two-unknown")
    asked = graph.invoke(START_INPUT, config, durability="sync")
    waiting = named(asked["__interrupt__"])
    assert waiting == [("call-book-1", "reconcile"), ("call-book-2", "reconcile")]
    for call_id, _ in waiting:
        client.reconcile(
            "t-two-unknown",
            call_id,
            expected_revision=client.get_tool_call("t-two-unknown", call_id).revision,
            operator="olga",
            reason="found it",
            evidence="booking system",
            result=f"booked ({call_id})",
        )
    done = graph.invoke(Command(resume="reconciled"), config, durability="sync")
    assert "__interrupt__" not in done
    assert done["messages"][-1].content == (
        "done: booked (call-book-1) | booked (call-book-2)"
    )
    assert lg.effects(workdir) == 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_parallel_approvals_are_asked_and_answered_in_one_round(
    effectd: TestDaemon, client: Client, workdir: Path, asynchronous: bool
) -> None:
    """Two parallel calls of a step that need approval, beside a read of
    unknown outcome: one interrupt asks about all three; one list of answers
    approves both and retries the read, and one resume finishes; each
    approved call runs once (issue 25 item 6: fails before the fix: one
    call per interrupt, a round each)."""
    run_id = f"t-two-approvals-{asynchronous}"
    search = {"name": "search", "args": {"q": "hotels"}, "id": "call-search-1"}
    script = ([*TWO_BOOKINGS[0], search],)
    unknown_call(client, run_id, "call-search-1", "search", {"q": "hotels"})
    policy = lg.APPROVAL_POLICY
    config = thread(run_id)

    async def answer(graph: Any, resume: Any) -> Any:
        if asynchronous:
            return await graph.ainvoke(resume, config, durability="sync")
        return graph.invoke(resume, config, durability="sync")

    async def main(graph: Any) -> tuple[Any, Any]:
        asked = await answer(graph, START_INPUT)
        assert lg.effects(workdir) == 0
        [value] = [i.value for i in asked["__interrupt__"]]
        answers = [
            approve(c, approver="ann") if c["effectd"] == "approval" else retry(c)
            for c in value["calls"]
        ]
        return asked, await answer(graph, Command(resume=answers))

    if asynchronous:

        async def with_async_client() -> tuple[Any, Any]:
            async with AsyncClient(effectd.target) as aclient:
                graph = ledgered_graph(aclient, workdir, script, policy=policy)
                return await main(graph)

        asked, done = asyncio.run(with_async_client())
    else:
        asked, done = asyncio.run(
            main(ledgered_graph(client, workdir, script, policy=policy))
        )
    assert named(asked["__interrupt__"]) == [
        ("call-book-1", "approval"),
        ("call-book-2", "approval"),
        ("call-search-1", "retry"),
    ]
    assert "__interrupt__" not in done, done["__interrupt__"]
    seen = sorted(done["messages"][-1].content.removeprefix("done: ").split(" | "))
    # The two bookings ran side by side: either may have been first.
    booked = ["booked Paris (#1)", "booked Rome (#2)"]
    other = ["booked Paris (#2)", "booked Rome (#1)"]
    assert seen in (["3 results for hotels", *booked], ["3 results for hotels", *other])
    assert lg.effects(workdir) == 2


def test_an_async_graph_interrupts_for_approval_and_reconciliation_too(
    effectd: TestDaemon, client: Client, workdir: Path
) -> None:
    """With an AsyncClient: an approval interrupt answered with `approve()`
    runs the tool once; a call a crashed attempt holds is waited for, then
    interrupts to reconcile."""
    hold_call(client, "t-async-held", lease_ms=1000)

    async def main() -> tuple[Any, Any, Any]:
        async with AsyncClient(effectd.target) as aclient:
            graph = ledgered_graph(aclient, workdir)
            config = thread("t-async-approve")
            asked = await graph.ainvoke(START_INPUT, config, durability="sync")
            answer = approve(asked["__interrupt__"][0].value, approver="ann")
            done = await graph.ainvoke(
                Command(resume=answer), config, durability="sync"
            )
            held = ledgered_graph(aclient, workdir, policy=lg.POLICY)
            reconcile = await held.ainvoke(
                START_INPUT, thread("t-async-held"), durability="sync"
            )
            return asked, done, reconcile

    asked, done, reconcile = asyncio.run(main())
    assert asked["__interrupt__"][0].value["effectd"] == "approval"
    assert done["messages"][-1].content.startswith("done: booked Paris (#1) |")
    assert reconcile["__interrupt__"][0].value["effectd"] == "reconcile"
    assert lg.effects(workdir) == 1


APPROVAL = {
    "effectd": "approval",
    "run_id": "r",
    "call_id": "c",
    "input_fingerprint": "sha256:aa",
    "revision": 1,
}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: approve({**APPROVAL, "effectd": "reconcile"}, approver="a"), "answer"),
        (lambda: reject(APPROVAL, approver=""), "approver"),
        (lambda: retry(APPROVAL), "retry"),
        (lambda: thread_run_id({"configurable": {}}), "thread id"),
    ],
)
def test_answers_and_settings_that_cannot_be_right_are_refused(
    make: Any, message: str
) -> None:
    """An answer to another kind of interrupt, an approval without an
    approver, a graph run without a thread id."""
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_a_sync_client_with_an_async_approver_is_refused(
    effectd: TestDaemon, client: Client
) -> None:
    async def main() -> None:
        async with AsyncClient(effectd.target) as aclient:
            with pytest.raises(TypeError, match="both"):
                LedgeredToolCalls(client, approver=aclient)

    asyncio.run(main())


def test_an_answer_for_another_call_is_refused(client: Client, workdir: Path) -> None:
    """An approval of another thread's call (same arguments) is refused:
    the thread asks again, saying why; nothing is recorded or run."""
    first = ledgered_graph(client, workdir)
    asked = first.invoke(START_INPUT, thread("t-one"), durability="sync")
    answer = approve(asked["__interrupt__"][0].value, approver="ann")
    second = ledgered_graph(client, workdir)
    second.invoke(START_INPUT, thread("t-two"), durability="sync")
    again = second.invoke(Command(resume=answer), thread("t-two"), durability="sync")
    refused = again["__interrupt__"][0].value["refused"]
    assert "about call 'call-book-1' of run 't-one'" in refused
    assert client.get_tool_call("t-two", "call-book-1").state is State.AWAITING_APPROVAL
    assert lg.effects(workdir) == 0


def test_an_operators_reconciled_result_reaches_the_model_as_json() -> None:
    """A result an operator recorded without `content` is shown whole."""
    call = GraphToolCall("r", "c", "book", {}, ToolPolicy().decide("book"))
    message = restored({"confirmation": 42}, call)
    assert isinstance(message, ToolMessage)
    assert (message.content, message.tool_call_id) == ('{"confirmation": 42}', "c")


def test_an_idempotent_write_reads_its_key_from_the_current_call(
    client: Client,
) -> None:
    """An IDEMPOTENT_WRITE tool gets the stable key `{thread}:{call id}`."""
    keys: list[str] = []

    @tool
    def upsert(who: str) -> str:
        """Upserts (with the target's idempotency key)."""
        step = current_call()
        assert step is not None
        keys.append(step.idempotency_key)
        return "ok"

    policy = '[tools.upsert]\neffect = "idempotent-write"'
    graph = graph_of(client, [upsert], one_call("upsert", who="x"), policy)
    graph.invoke(START_INPUT, thread("t-key"), durability="sync")
    assert keys == ["t-key:c-1"]
