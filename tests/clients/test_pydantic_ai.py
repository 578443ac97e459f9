"""effectd_client.contrib.pydantic_ai: a real Pydantic AI agent (its FunctionModel, no
network) whose tools go through a real daemon runs each side effect at most
once across a real crash, replays committed results, and binds approvals to
the exact arguments."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RunUsage

import effectd_client.contrib.pydantic_ai as effectd_pydantic_ai
from effectd_client import (
    AsyncClient,
    Client,
    Effect,
    InputMismatch,
    State,
)
from effectd_client.contrib.pydantic_ai import (
    METADATA_KEY,
    DeferredCallsNotResumed,
    EffectdToolset,
    ToolPolicy,
    ToolRule,
    decide_deferred,
)
from effectd_client.pytest_plugin import effectd_daemon  # noqa: F401
from effectd_client.testing import CrashPoint, TestDaemon, crash_and_resume
from sidecar.testing import RunningDaemon
from tests.clients.pydantic_agent import (
    HISTORY,
    agent,
    approving_agent,
    executions,
    run_agent,
    tools,
    unwrapped_agent,
)
from tests.support.imports import imported_by


@pytest.fixture
def target(effectd_daemon: TestDaemon) -> str:  # noqa: F811
    """A real daemon (`effectd_client.testing`), on a real clock: a crashed
    call's lease runs out."""
    return effectd_daemon.target


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The external system's counters and the run's persisted history."""
    return tmp_path


def run(target: str, state: Path, **options: Any) -> Any:
    return asyncio.run(run_agent(target, state, **options))


def check_at_most_once(state: Path, tool: str) -> None:
    """The property: whatever crashed, the tool's effect happened once."""
    effects = executions(state, tool)
    if len(effects) > 1:
        raise AssertionError(f"{tool} ran {len(effects)} times: {effects}")


def seen(output: Any) -> dict[str, str]:
    """What the scripted model saw of each tool, from its final answer."""
    assert isinstance(output, str), output
    return dict(json.loads(output))


def deferred(output: Any, tool_call_id: str) -> dict[str, Any]:
    """The effectd facts of a call the run deferred for a human."""
    assert isinstance(output, DeferredToolRequests), output
    return dict(output.metadata[tool_call_id][METADATA_KEY])


def rewind(state: Path, responses: int) -> None:
    """The persisted history cut after its `responses`-th model response, as
    a checkpoint taken before the tools of that response had run."""
    history = ModelMessagesTypeAdapter.validate_json((state / HISTORY).read_bytes())
    kept, count = [], 0
    for message in history:
        kept.append(message)
        count += isinstance(message, ModelResponse)
        if count == responses:
            break
    (state / HISTORY).write_bytes(ModelMessagesTypeAdapter.dump_json(kept))


def test_a_resumed_run_gets_the_stored_result_without_running_the_tool(
    target: str, state: Path
) -> None:
    """Resumed from a checkpoint taken before its tools ran, the run is
    answered from the ledger: the model sees the first result, the tool ran
    once."""
    first = seen(run(target, state))
    rewind(state, responses=1)
    again = seen(run(target, state))
    assert again == first == {"send": "sent #1 to ann", "lookup": "Oslo: sunny"}
    assert executions(state, "send") == ["ann"]
    assert executions(state, "lookup") == ["Oslo", "Oslo"]  # the checkpoint's


def test_a_failed_call_is_replayed_as_the_same_failure(
    target: str, state: Path
) -> None:
    """A tool that raised ToolFailed is committed as an error: resumed from a
    checkpoint before it ran, the model gets the same failure, unsent."""
    first = seen(run(target, state, failing=True))
    rewind(state, responses=1)
    again = seen(run(target, state, failing=True))
    assert again["send"] == first["send"]
    assert "mailbox of ann full (#1)" in first["send"]
    assert executions(state, "send") == ["ann"]


def test_an_idempotent_write_reads_its_key_from_the_ledger(
    target: str, state: Path
) -> None:
    """Declared IDEMPOTENT_WRITE by the policy: the tool finds its key
    `{run_id}:{tool_call_id}` in `current_call()`; the call is recorded with
    that effect."""
    run(target, state, send_effect=Effect.IDEMPOTENT_WRITE)
    key = (state / "send.key").read_text()
    run_id, _, call_id = key.partition(":")
    assert call_id == "tc-send"
    with Client(target) as client:
        call = client.get_tool_call(run_id, "tc-send")
    assert (call.effect, call.idempotency_key) == (Effect.IDEMPOTENT_WRITE, key)


def test_an_outcome_lost_in_the_run_is_deferred_not_retried(
    target: str, state: Path
) -> None:
    """The tool's connection failed after its effect: UNKNOWN, and the run
    ends with the call deferred for a human instead of a retry prompt the
    model would answer with a new call."""
    output = run(target, state, lost=True)
    facts = deferred(output, "tc-send")
    assert (facts["state"], facts["action"]) == ("UNKNOWN", "reconcile")
    assert executions(state, "send") == ["ann"]
    assert deferred(run(target, state), "tc-send")["state"] == "UNKNOWN"
    assert executions(state, "send") == ["ann"]


def test_a_declared_run_id_keys_the_calls(target: str, state: Path) -> None:
    """`run_id=` names the ledger's run (an order id): the calls are found
    there, and a second agent run under it gets the stored results."""
    first = seen(run(target, state, run_id="order-42"))
    (state / HISTORY).unlink()
    assert seen(run(target, state, run_id="order-42")) == first
    assert executions(state, "send") == ["ann"]
    with Client(target) as client:
        assert client.get_tool_call("order-42", "tc-send").state is State.COMMITTED


@pytest.mark.slow
def test_a_crash_after_the_commit_replays_the_stored_result(
    target: str, state: Path
) -> None:
    """The agent process SIGKILLed right after the send's commit: the resumed
    run (from its persisted history) gets the stored result; count 1."""
    report = crash_and_resume(agent, target, str(state), at=CrashPoint.AFTER_COMMIT)
    assert report.crashed, report
    assert report.resumed_error is None, report.resumed_error
    assert seen(report.resumed)["send"] == "sent #1 to ann"
    check_at_most_once(state, "send")
    assert executions(state, "send") == ["ann"]


@pytest.mark.slow
def test_a_crash_mid_tool_is_deferred_for_a_human_not_run_again(
    target: str, state: Path
) -> None:
    """SIGKILLed inside the send, after its effect, before its commit: the
    resumed run ends with the call deferred (UNKNOWN, to reconcile); the send
    ran once and the model never went on to the lookup."""
    (state / "crash-send").touch()
    report = crash_and_resume(agent, target, str(state))
    assert report.crashed
    facts = deferred(report.resumed, "tc-send")
    assert (facts["state"], facts["action"]) == ("UNKNOWN", "reconcile")
    assert report.resumed.calls[0].tool_call_id == "tc-send"
    check_at_most_once(state, "send")
    assert executions(state, "lookup") == []
    # Resumed again: still deferred, still once.
    assert deferred(run(target, state), "tc-send")["state"] == "UNKNOWN"
    check_at_most_once(state, "send")


@pytest.mark.slow
def test_a_read_killed_mid_call_runs_again_under_the_retry_rules(
    target: str, state: Path
) -> None:
    """SIGKILLed inside the lookup (a READ), after the send committed: the
    resumed run looks up again and finishes; the send ran once."""
    (state / "crash-lookup").touch()
    child = multiprocessing.get_context("spawn").Process(
        target=agent, args=(target, str(state))
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    with Client(target) as client:
        for _ in range(600):  # bounded: the 300 ms lease runs out
            if not list(client.list_tool_calls(states=(State.STARTED,))):
                break
            for call in client.list_tool_calls(states=(State.STARTED,)):
                client.recover(call.run_id)
            time.sleep(0.1)
    answer = seen(run(target, state))
    assert answer == {"send": "sent #1 to ann", "lookup": "Oslo: sunny"}
    assert executions(state, "lookup") == ["Oslo", "Oslo"]
    assert executions(state, "send") == ["ann"]


@pytest.mark.slow
def test_negative_control_pydantic_ais_own_execution_sends_twice(
    target: str, state: Path
) -> None:
    """The same crash without the wrapper: the resumed run sends again, and
    the property check catches it."""
    (state / "crash-send").touch()
    report = crash_and_resume(unwrapped_agent, target, str(state))
    assert report.crashed
    assert seen(report.resumed)["send"] == "sent #2 to ann"
    with pytest.raises(AssertionError, match="send ran 2 times"):
        check_at_most_once(state, "send")


@pytest.mark.slow
def test_a_reconciled_call_gives_the_resumed_run_the_result_found(
    target: str, state: Path
) -> None:
    """After the crash an operator reconciles the send with the result found
    in the target system; the next resume hands it to the model, unsent."""
    (state / "crash-send").touch()
    report = crash_and_resume(agent, target, str(state))
    facts = deferred(report.resumed, "tc-send")
    with Client(target) as client:
        client.reconcile(
            facts["run_id"],
            "tc-send",
            expected_revision=client.get_tool_call(facts["run_id"], "tc-send").revision,
            operator="oncall",
            reason="found in the outbox",
            evidence="outbox message 1",
            result="sent #1 to ann (reconciled)",
        )
    answer = seen(run(target, state))
    assert answer["send"] == "sent #1 to ann (reconciled)"
    assert executions(state, "send") == ["ann"]


def test_an_approval_is_asked_for_and_recorded_for_the_exact_arguments(
    target: str, state: Path
) -> None:
    """A `requires_approval` tool: the run ends with the approval request and
    the ledger waits for it; approved through DeferredToolResults, it runs
    once, after the approval the ledger recorded."""
    first = run(target, state, approval=True)
    facts = deferred(first, "tc-send")
    assert (facts["state"], facts["action"]) == ("AWAITING_APPROVAL", "approve")
    assert [c.tool_call_id for c in first.approvals] == ["tc-send"]
    assert executions(state, "send") == []
    answer = seen(approving_agent(target, str(state)))
    assert answer["send"] == "sent #1 to ann"
    with Client(target) as client:
        call = client.get_tool_call(facts["run_id"], "tc-send")
    assert call.state is State.COMMITTED
    assert call.input_fingerprint == facts["input_fingerprint"]
    assert call.history[:3] == ("prepare", "approve", "start"), call.history


def test_an_approval_does_not_cover_other_arguments(target: str, state: Path) -> None:
    """Approved with `override_args` (other arguments than the call was
    prepared and approved for): refused, never run."""
    run(target, state, approval=True)
    changed = DeferredToolResults(
        approvals={"tc-send": ToolApproved(override_args={"to": "mallory"})}
    )
    with pytest.raises(InputMismatch):
        run(target, state, approval=True, results=changed)
    assert executions(state, "send") == []


@pytest.mark.slow
def test_an_approval_then_a_crash_mid_tool_runs_it_once(
    target: str, state: Path
) -> None:
    """Approved, then the resumed process is killed inside the send: resumed
    with the same approval again, the call is deferred, not sent twice."""
    run(target, state, approval=True)
    (state / "crash-send").touch()
    report = crash_and_resume(approving_agent, target, str(state))
    assert report.crashed
    assert deferred(report.resumed, "tc-send")["action"] == "reconcile"
    check_at_most_once(state, "send")


def test_an_approval_in_effectd_holds_across_a_restart_without_results(
    target: str, state: Path
) -> None:
    """An approver decides in effectd (`decide_deferred`); the restarted agent
    resumes without any DeferredToolResults and runs the call once."""
    first = run(target, state, approval=True)

    async def approve() -> None:
        async with AsyncClient(target) as client:
            await decide_deferred(
                client,
                first,
                "tc-send",
                approve=True,
                approver="alice",
                reason="ann expects it",
            )

    asyncio.run(approve())
    assert seen(run(target, state, approval=True))["send"] == ("sent #1 to ann")
    assert executions(state, "send") == ["ann"]


def test_without_an_approver_name_only_effectds_approval_counts(
    target: str, state: Path
) -> None:
    """`approver=None`: a Pydantic AI approval alone defers the call again; an
    approver's rejection in effectd reaches the model as a failure, unsent."""
    first = run(target, state, approval=True, approver=None)
    results = DeferredToolResults(approvals={"tc-send": True})
    again = run(target, state, approval=True, approver=None, results=results)
    assert deferred(again, "tc-send")["action"] == "approve"

    async def reject() -> None:
        async with AsyncClient(target) as client:
            await decide_deferred(
                client,
                first,
                "tc-send",
                approve=False,
                approver="alice",
                reason="not today",
            )

    asyncio.run(reject())
    answer = seen(run(target, state, approval=True, approver=None))
    assert "rejected" in answer["send"]
    assert executions(state, "send") == []


def test_decide_deferred_refuses_a_call_effectd_did_not_defer() -> None:
    """Only an approval deferred by the wrapper carries the ledger's facts."""
    requests = DeferredToolRequests(metadata={"tc-1": {"other": {}}})

    async def decide() -> None:
        await decide_deferred(
            None,  # type: ignore[arg-type]  # never reached
            requests,
            "tc-1",
            approve=True,
            approver="alice",
            reason="-",
        )

    with pytest.raises(KeyError):
        asyncio.run(decide())


@pytest.mark.slow
def test_a_deferral_the_agent_cannot_output_stops_the_run(
    target: str, state: Path
) -> None:
    """An agent without DeferredToolRequests among its output types: the
    in-doubt call stops the run with Pydantic AI's error, never re-run."""
    (state / "crash-send").touch()
    crash_and_resume(agent, target, str(state))
    rewind(state, responses=1)
    with pytest.raises(UserError, match="DeferredToolRequests"):
        run(target, state, deferred_output=False)
    assert executions(state, "send") == ["ann"]


def test_importing_the_client_does_not_import_pydantic_ai() -> None:
    """The extra is imported only by `effectd_client.contrib.pydantic_ai`."""
    assert imported_by("import effectd_client", ["pydantic_ai"]) == []


# -- one toolset call at a time, on the manual-clock daemon ---------------------


def context(call_id: str | None, run_id: str = "r-1") -> RunContext[None]:
    return RunContext(
        deps=None,
        model=TestModel(),
        usage=RunUsage(),
        tool_call_id=call_id,
        run_id=run_id,
    )


def toolset_with(
    effectd: AsyncClient, **options: Any
) -> tuple[EffectdToolset[None], list[str]]:
    """A toolset whose `retry` raises ModelRetry once it has counted one more
    call, and its count."""
    plain: FunctionToolset[None] = FunctionToolset()
    counted: list[str] = []

    @plain.tool_plain
    async def retry(word: str) -> str:
        counted.append(word)
        raise ModelRetry(f"say it again, not {word!r}")

    return EffectdToolset(plain, client=effectd, **options), counted


async def call(toolset: EffectdToolset[None], ctx: RunContext[None]) -> Any:
    tools = await toolset.get_tools(ctx)
    return await toolset.call_tool("retry", {"word": "hi"}, ctx, tools["retry"])


def test_a_model_retry_is_replayed_as_a_model_retry(daemon: RunningDaemon) -> None:
    """A tool that asked the model to retry is committed as that answer: the
    same call again gets the same ModelRetry, and the tool is not run."""

    async def body() -> None:
        async with AsyncClient(daemon.target) as effectd:
            toolset, counted = toolset_with(effectd)
            for _ in range(2):
                with pytest.raises(ModelRetry, match="not 'hi'"):
                    await call(toolset, context("tc-1"))
            assert counted == ["hi"]

    asyncio.run(body())


def test_a_call_held_by_a_live_attempt_is_deferred_to_wait(
    daemon: RunningDaemon,
) -> None:
    """Another process holds the call (a live lease, the clock stands still):
    deferred with `wait`, never run beside it; the run id comes from the
    declared function."""

    async def body() -> None:
        async with AsyncClient(daemon.target) as effectd:
            await effectd.prepare_tool(
                "job-7", "tc-1", "retry", {"word": "hi"}, start=True
            )
            toolset, counted = toolset_with(effectd, run_id=lambda ctx: "job-7")
            with pytest.raises(CallDeferred) as deferral:
                await call(toolset, context("tc-1"))
            assert deferral.value.metadata is not None
            assert deferral.value.metadata[METADATA_KEY]["action"] == "wait"
            assert counted == []

    asyncio.run(body())


def test_a_call_without_a_tool_call_id_is_refused(daemon: RunningDaemon) -> None:
    """No tool call id, no ledger key: refused before anything runs."""

    async def body() -> None:
        async with AsyncClient(daemon.target) as effectd:
            toolset, counted = toolset_with(effectd)
            with pytest.raises(ValueError, match="without tool_call_id"):
                await call(toolset, context(None))
            assert counted == []

    asyncio.run(body())


@pytest.mark.parametrize(
    "policy",
    [
        ToolPolicy({"retry": ToolRule(Effect.READ, require_approval=True)}),
        # The operator's TOML file, as LangGraph's adapter reads it: the
        # policy's default approval covers a rule that does not say.
        ToolPolicy.from_toml('require_approval = true\n[tools.retry]\neffect = "read"'),
    ],
    ids=["rule", "toml-default"],
)
def test_the_policy_requires_approval_of_a_tool_that_does_not_declare_it(
    daemon: RunningDaemon, policy: ToolPolicy
) -> None:
    """The policy requires approval of the tool: the call is deferred to an
    approver, bound to its arguments; it does not run."""

    async def body() -> None:
        async with AsyncClient(daemon.target) as effectd:
            toolset, counted = toolset_with(effectd, policy=policy)
            with pytest.raises(ApprovalRequired) as deferral:
                await call(toolset, context("tc-1"))
            assert deferral.value.metadata is not None
            facts = deferral.value.metadata[METADATA_KEY]
            assert (facts["action"], facts["state"]) == ("approve", "AWAITING_APPROVAL")
            assert facts["effect"] == "READ"
            assert counted == []

    asyncio.run(body())


def test_the_public_surface_is_pinned() -> None:
    """What `effectd_client.contrib.pydantic_ai` exports."""
    assert sorted(effectd_pydantic_ai.__all__) == [
        "DeferredCallsNotResumed",
        "EffectdToolset",
        "METADATA_KEY",
        "PolicyError",
        "ToolDecision",
        "ToolPolicy",
        "ToolRule",
        "decide_deferred",
        "effectd_metadata",
    ]


def test_a_call_from_a_response_without_a_run_id_is_refused(
    daemon: RunningDaemon,
) -> None:
    """A history whose response carries no run id (written without them):
    refused, since this run's new id would run the call again on every
    resume; a declared `run_id=` runs it."""
    made = ModelResponse(parts=[ToolCallPart("retry", {"word": "hi"}, "tc-1")])

    async def body() -> None:
        async with AsyncClient(daemon.target) as effectd:
            toolset, counted = toolset_with(effectd)
            ctx = replace(context("tc-1"), messages=[made])
            with pytest.raises(ValueError, match="has no run_id"):
                await call(toolset, ctx)
            assert counted == []
            declared, counted = toolset_with(effectd, run_id="order-9")
            with pytest.raises(ModelRetry):
                await call(declared, ctx)
            assert counted == ["hi"]

    asyncio.run(body())


# -- parallel calls of one model response --------------------------------------


def parallel_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Sends to Ann and looks the weather up in one response; then answers
    with every result it saw."""
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(
            parts=[
                ToolCallPart("send", {"to": "ann"}, tool_call_id="tc-send"),
                ToolCallPart("lookup", {"city": "Oslo"}, tool_call_id="tc-lookup"),
            ]
        )
    returns = {
        p.tool_name: p.model_response_str()
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart)
    }
    return ModelResponse(parts=[TextPart(json.dumps(returns, sort_keys=True))])


def parallel_agent(
    effectd: AsyncClient, state: Path, run_id: str
) -> tuple[Agent[None, Any], EffectdToolset[None]]:
    toolset = EffectdToolset(
        tools(state),
        client=effectd,
        policy={"lookup": Effect.READ},
        run_id=run_id,
    )
    agent = Agent(
        FunctionModel(parallel_script),
        toolsets=[toolset],
        output_type=[str, DeferredToolRequests],
    )
    return agent, toolset


def held_send(target: str, run_id: str, *, unknown: bool) -> None:
    """The send of another process: its attempt holds a live lease, or it
    died mid-tool (UNKNOWN)."""
    with Client(target) as client:
        held = client.prepare_tool(run_id, "tc-send", "send", {"to": "ann"}, start=True)
        if unknown:
            client.report_unknown(run_id, "tc-send", held.call.attempt, "it died")


def test_a_deferred_sibling_is_carried_by_the_resume_and_gets_the_reconciled_result(
    target: str, state: Path
) -> None:
    """Two parallel calls: the lookup runs, the send is deferred (UNKNOWN).
    The operator reconciles the send; the run resumed as the docs say
    (`resume_results`) hands the model the result found and the lookup's,
    and runs neither again (issue 25 item 1: fails before the fix: the
    resume answered the send "interrupted" and the run completed)."""
    held_send(target, "order-7", unknown=True)

    async def body() -> Any:
        async with AsyncClient(target) as effectd:
            agent, toolset = parallel_agent(effectd, state, "order-7")
            first = await agent.run("go")
            facts = deferred(first.output, "tc-send")
            assert facts["action"] == "reconcile"
            # The deferral names the run the toolset was given, and how to see it.
            assert facts["show"] == "effectd ctl show order-7 tc-send"
            history = first.all_messages()
            call = await effectd.get_tool_call("order-7", "tc-send")
            await effectd.reconcile(
                "order-7",
                "tc-send",
                expected_revision=call.revision,
                operator="oncall",
                reason="found it",
                evidence="outbox message 1",
                result="sent to ann (reconciled)",
            )
            results = await toolset.resume_results(history)
            done = await agent.run(
                message_history=history, deferred_tool_results=results
            )
            return done.output

    assert seen(asyncio.run(body())) == {
        "lookup": "Oslo: sunny",
        "send": "sent to ann (reconciled)",
    }
    assert executions(state, "send") == []
    assert executions(state, "lookup") == ["Oslo"]


def test_a_resume_without_the_deferred_sibling_is_refused_not_answered_interrupted(
    target: str, state: Path
) -> None:
    """Two parallel calls, the send held by another process (a live lease):
    resumed from the history alone, the run is refused before the model is
    asked, naming the send; resumed with `resume_results`, the send is
    deferred again (still in progress), never answered "interrupted" (issue
    25 item 1: fails before the fix: the run completed, the send
    "interrupted" for the model)."""
    held_send(target, "order-8", unknown=False)

    async def body() -> tuple[DeferredCallsNotResumed, Any]:
        async with AsyncClient(target) as effectd:
            agent, toolset = parallel_agent(effectd, state, "order-8")
            first = await agent.run("go")
            assert deferred(first.output, "tc-send")["action"] == "wait"
            history = first.all_messages()
            with pytest.raises(DeferredCallsNotResumed) as refused:
                await agent.run(message_history=history)
            results = await toolset.resume_results(history)
            again = await agent.run(
                message_history=history, deferred_tool_results=results
            )
            return refused.value, again.output

    refused, again = asyncio.run(body())
    assert [c.call_id for c in refused.calls] == ["tc-send"]
    assert "tc-send (send, STARTED, run order-8)" in str(refused)
    assert deferred(again, "tc-send")["action"] == "wait"
    assert executions(state, "send") == []


def test_a_resume_carries_a_human_approval_beside_a_deferred_sibling(
    target: str, state: Path
) -> None:
    """The send needs approval, the lookup is deferred (another process
    holds it): the approval given in Pydantic AI is recorded and the send
    runs once; the lookup comes back through the toolset as a resume, not
    an approval (it waits again)."""

    async def body() -> Any:
        async with AsyncClient(target) as effectd:
            await effectd.prepare_tool(
                "order-9",
                "tc-lookup",
                "lookup",
                {"city": "Oslo"},
                effect=Effect.READ,
                start=True,
            )
            toolset = EffectdToolset(
                tools(state, approval=True),
                client=effectd,
                policy={"lookup": Effect.READ},
                run_id="order-9",
            )
            agent = Agent(
                FunctionModel(parallel_script),
                toolsets=[toolset],
                output_type=[str, DeferredToolRequests],
            )
            first = await agent.run("go")
            assert isinstance(first.output, DeferredToolRequests)
            assert [c.tool_call_id for c in first.output.approvals] == ["tc-send"]
            history = first.all_messages()
            approved = DeferredToolResults(approvals={"tc-send": True})
            results = await toolset.resume_results(history, approved)
            assert results is not None
            assert set(results.approvals) == {"tc-send", "tc-lookup"}
            again = await agent.run(
                message_history=history, deferred_tool_results=results
            )
            return again.output

    output = asyncio.run(body())
    assert deferred(output, "tc-lookup")["action"] == "wait"
    assert executions(state, "send") == ["ann"]
    assert executions(state, "lookup") == []
