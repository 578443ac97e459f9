"""effectd_client.contrib.agent_framework: a real Agent Framework agent (a
scripted chat client of the framework's own `BaseChatClient`, no network)
whose function tools go through a real daemon via `EffectdMiddleware`:
committed results are replayed, never re-executed; an unknown outcome
pauses for reconciliation (every unsettled sibling in one response) and is
never run again; approvals are decided in effectd, bound to the arguments.
The crash scenarios (a process SIGKILLed before, inside and after a tool)
are the conformance suite's (`tests/adapters`, driver `agent_framework`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
    MiddlewareFailure,
    tool,
)

import effectd_client.contrib.agent_framework as effectd_agent_framework
from effectd_client import AsyncClient, Effect, State, current_call
from effectd_client.contrib.agent_framework import (
    METADATA_KEY,
    EffectdMiddleware,
    ToolPolicy,
    ToolRule,
    decide_request,
    facts_of,
)
from effectd_client.pytest_plugin import effectd_daemon  # noqa: F401
from effectd_client.testing import TestDaemon
from sidecar.testing import RunningDaemon
from tests.support.imports import imported_by

# A model turn: the calls it makes together, (call id, tool, arguments).
Turn = Sequence[tuple[str, str, dict[str, Any]]]


class ScriptedChatClient(
    FunctionInvocationLayer[Any], ChatMiddlewareLayer[Any], BaseChatClient[Any]
):
    """The model: its n-th turn makes the script's n-th calls, then answers
    with every tool result it saw, as JSON {call id: result}."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        super().__init__()
        self.turns = list(turns)

    async def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Any, **kw: Any
    ) -> ChatResponse[Any]:
        assert not stream
        turn = sum(
            m.role == "assistant"
            and any(c.type in ("function_call", "text") for c in m.contents)
            for m in messages
        )
        if turn < len(self.turns):
            contents = [
                Content.from_function_call(call_id=c, name=n, arguments=a)
                for c, n, a in self.turns[turn]
            ]
        else:
            seen = {
                c.call_id: str(c.result)
                for m in messages
                for c in m.contents
                if c.type == "function_result"
            }
            contents = [Content.from_text(json.dumps(seen))]
        return ChatResponse(messages=[Message(role="assistant", contents=contents)])


class World:
    """The external system the tools act on, and the tools."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.keys: list[str] = []
        # While the mail server is down, its answers are lost, and only the
        # mail to these got through before the connection dropped.
        self.down = True
        self.through = {"u1"}

    def tools(self) -> list[Any]:
        @tool(name="send")
        async def send(to: str) -> str:
            """Sends an e-mail (a side effect)."""
            self.sent.append(to)
            return f"sent to {to}"

        @tool(name="mail")
        async def mail(to: str) -> str:
            """Sends; while the server is down its answer is lost (the
            outcome unknown)."""
            if not self.down or to in self.through:
                self.sent.append(to)
            if self.down:
                raise TimeoutError("the mail server did not answer")
            return f"mailed {to}"

        @tool(name="broken")
        async def broken(to: str) -> str:
            """Refuses before acting: a definite error."""
            self.sent.append(to)
            raise ValueError(f"no such mailbox: {to}")

        @tool(name="pay")
        async def pay(amount: int) -> str:
            """An idempotent write: the payment system dedupes by the key."""
            call = current_call()
            assert call is not None
            self.keys.append(call.idempotency_key)
            return f"paid {amount}"

        @tool(name="wire", approval_mode="always_require")
        async def wire(amount: int) -> str:
            """Declared to need an approval in the framework."""
            self.sent.append(f"wire {amount}")
            return f"wired {amount}"

        return [send, mail, broken, pay, wire]


def agent_of(
    world: World, turns: Sequence[Turn], middleware: Sequence[Any] = ()
) -> Agent[Any]:
    return Agent(
        client=ScriptedChatClient(turns),
        tools=world.tools(),
        middleware=list(middleware),
    )


async def run(
    agent: Agent[Any], session: AgentSession, given: Any = "go"
) -> tuple[dict[str, str], list[Content]]:
    """One run: what the model saw (when it finished), and the pauses."""
    response = await agent.run(given, session=session)
    pauses = list(response.user_input_requests)
    return ({} if pauses else json.loads(response.text)), pauses


def resumed(pauses: Sequence[Content], *, approved: bool = True) -> Message:
    """The framework's own answer to each pause: back to the middleware."""
    return Message(
        role="user",
        contents=[p.to_function_approval_response(approved) for p in pauses],
    )


def effectd_of(pause: Content) -> dict[str, Any]:
    facts = facts_of(pause)
    assert facts is not None, pause
    return facts


@pytest.fixture
def target(effectd_daemon: TestDaemon) -> str:  # noqa: F811
    """A real daemon (`effectd_client.testing`), on a real clock."""
    return effectd_daemon.target


def test_a_committed_call_is_replayed_and_the_tool_does_not_run(target: str) -> None:
    """The run, then the same turn again from the session as it was (a
    retried job): the model sees the stored result; the e-mail went once.
    The ledger's run is the session's id."""

    async def body() -> None:
        world = World()
        turns = [[("c1", "send", {"to": "ann"})]]
        async with AsyncClient(target) as effectd:
            agent = agent_of(world, turns, [EffectdMiddleware(client=effectd)])
            session = agent.create_session()
            before = session.to_dict()
            first, _ = await run(agent, session)
            again, _ = await run(agent, AgentSession.from_dict(before))
            assert first == again == {"c1": "sent to ann"}
            assert world.sent == ["ann"]
            call = await effectd.get_tool_call(session.session_id, "c1")
            assert call.state is State.COMMITTED

    asyncio.run(body())


def test_negative_control_without_the_middleware_the_retry_sends_twice(
    target: str,
) -> None:
    """The framework alone runs the tool again on the retried turn."""

    async def body() -> None:
        world = World()
        agent = agent_of(world, [[("c1", "send", {"to": "ann"})]])
        session = agent.create_session()
        before = session.to_dict()
        await run(agent, session)
        await run(agent, AgentSession.from_dict(before))
        assert world.sent == ["ann", "ann"]

    asyncio.run(body())


def test_a_definite_error_is_committed_and_replayed_without_running(
    target: str,
) -> None:
    """A tool that refused is committed as an error: the retried turn gives
    the model the framework's error result again; the tool ran once."""

    async def body() -> None:
        world = World()
        turns = [[("c1", "broken", {"to": "nobody"})]]
        async with AsyncClient(target) as effectd:
            mw = EffectdMiddleware(client=effectd, run_id="job-err")
            for _ in range(2):
                agent = agent_of(world, turns, [mw])
                seen, _ = await run(agent, agent.create_session())
                assert seen["c1"].startswith("Error:")
            assert world.sent == ["nobody"]
            call = await effectd.get_tool_call("job-err", "c1")
            assert call.state is State.COMMITTED
            assert call.result is not None
            assert call.result.error_code == "ValueError"

    asyncio.run(body())


def test_an_unknown_outcome_pauses_every_sibling_and_is_never_run_again(
    target: str,
) -> None:
    """Three parallel calls lose their answers: one response pauses on all
    three for reconciliation; resumed unsettled, they pause again and none
    runs again; reconciled (one as done, with the result found, two as
    never done), the resumed run gives the model the found result and runs
    the other two once, through the tool they were verified not done by."""

    async def body() -> None:
        world = World()
        turns = [[(f"c{i}", "mail", {"to": f"u{i}"}) for i in (1, 2, 3)]]
        async with AsyncClient(target) as effectd:
            agent = agent_of(world, turns, [EffectdMiddleware(client=effectd)])
            session = agent.create_session()
            _, pauses = await run(agent, session)
            facts = sorted(
                (effectd_of(p)["call_id"], effectd_of(p)["action"]) for p in pauses
            )
            assert facts == [
                ("c1", "reconcile"),
                ("c2", "reconcile"),
                ("c3", "reconcile"),
            ]
            assert world.sent == ["u1"]
            _, pauses = await run(agent, session, resumed(pauses))
            assert len(pauses) == 3
            assert world.sent == ["u1"]
            run_id = session.session_id
            for pause in pauses:
                call = await effectd.get_tool_call(run_id, effectd_of(pause)["call_id"])
                assert call.state is State.UNKNOWN
                done = call.call_id == "c1"
                await effectd.reconcile(
                    run_id,
                    call.call_id,
                    expected_revision=call.revision,
                    operator="olga",
                    reason="checked the mail server",
                    evidence="its log",
                    result="found: sent to u1" if done else None,
                    not_executed=not done,
                    confirmed_dead_attempt=0 if done else call.attempt,
                )
            world.down = False
            seen, pauses = await run(agent, session, resumed(pauses))
            assert pauses == []
            assert seen == {
                "c1": "found: sent to u1",
                "c2": "mailed u2",
                "c3": "mailed u3",
            }
            assert sorted(world.sent) == ["u1", "u2", "u3"]

    asyncio.run(body())


APPROVAL = ToolPolicy({"send": ToolRule(Effect.SIDE_EFFECT, require_approval=True)})


def edited(pause: Content, **arguments: Any) -> Message:
    """The framework's approval, of other arguments than those shown."""
    call = pause.function_call
    assert call is not None
    other = Content.from_function_call(
        call_id=call.call_id or "",
        name=call.name or "",
        arguments=arguments,
        id=call.id,
    )
    response = Content.from_function_approval_response(
        True, id=pause.id or "", function_call=other
    )
    return Message(role="user", contents=[response])


def test_an_approval_is_decided_in_effectd_and_the_framework_alone_authorizes_nothing(
    target: str,
) -> None:
    """The policy requires approval: the run pauses with the ledger's facts;
    the framework's own approval runs nothing (paused again, still
    AWAITING_APPROVAL); approved with edited arguments: refused, paused
    again on the arguments shown; once an approver decided in effectd
    (`decide_request`), the resumed run sends once."""

    async def body() -> None:
        world = World()
        turns = [[("c1", "send", {"to": "ann"})]]
        async with AsyncClient(target) as effectd:
            mw = EffectdMiddleware(client=effectd, policy=APPROVAL, run_id="job-ok")
            agent = agent_of(world, turns, [mw])
            session = agent.create_session()
            _, [pause] = await run(agent, session)
            facts = effectd_of(pause)
            assert (facts["action"], facts["state"]) == ("approve", "AWAITING_APPROVAL")
            assert facts["show"] == "effectd ctl show job-ok c1"
            _, [pause] = await run(agent, session, resumed([pause]))
            assert effectd_of(pause)["action"] == "approve"
            _, [pause] = await run(agent, session, edited(pause, to="mallory"))
            assert pause.function_call is not None
            assert pause.function_call.parse_arguments() == {"to": "ann"}
            assert world.sent == []
            call = await effectd.get_tool_call("job-ok", "c1")
            assert call.state is State.AWAITING_APPROVAL
            await decide_request(
                effectd, pause, approve=True, approver="ann", reason="ok"
            )
            seen, pauses = await run(agent, session, resumed([pause]))
            assert (seen, pauses) == ({"c1": "sent to ann"}, [])
            assert world.sent == ["ann"]

    asyncio.run(body())


def test_an_approver_name_records_the_frameworks_approval_of_the_shown_arguments(
    target: str,
) -> None:
    """`approver=` records the framework's approval in the ledger under that
    name, for the arguments shown: the framework binds an answer to the
    request it answers and drops an edited function call, so edited
    arguments never run; the shown ones run once."""

    async def body() -> None:
        world = World()
        turns = [[("c1", "send", {"to": "ann"})]]
        async with AsyncClient(target) as effectd:
            mw = EffectdMiddleware(
                client=effectd, policy=APPROVAL, run_id="job-ui", approver="ui"
            )
            agent = agent_of(world, turns, [mw])
            session = agent.create_session()
            _, [pause] = await run(agent, session)
            seen, _ = await run(agent, session, edited(pause, to="mallory"))
            assert seen == {"c1": "sent to ann"}
            assert world.sent == ["ann"]
            call = await effectd.get_tool_call("job-ui", "c1")
            assert call.input_fingerprint == effectd_of(pause)["input_fingerprint"]
            assert call.history[:2] == ("prepare", "approve")

    asyncio.run(body())


def test_a_call_with_other_arguments_than_those_awaiting_approval_is_refused(
    target: str,
) -> None:
    """The ledger holds the call for approval of {"to": "ann"}; the same call
    comes with other arguments (an argument-repair middleware, a changed
    history): refused (`mismatch`), paused again on every answer, and
    nothing runs, approver name or not."""

    async def body() -> None:
        world = World()
        async with AsyncClient(target) as effectd:
            await effectd.prepare_tool(
                "job-x", "c1", "send", {"to": "ann"}, require_approval=True
            )
            mw = EffectdMiddleware(
                client=effectd, policy=APPROVAL, run_id="job-x", approver="ui"
            )
            agent = agent_of(world, [[("c1", "send", {"to": "mallory"})]], [mw])
            session = agent.create_session()
            _, [pause] = await run(agent, session)
            assert pause.function_call is not None
            assert pause.function_call.parse_arguments() == {"to": "mallory"}
            facts = effectd_of(pause)
            assert (facts["action"], facts["state"]) == (
                "mismatch",
                "AWAITING_APPROVAL",
            )
            _, [pause] = await run(agent, session, resumed([pause]))
            assert effectd_of(pause)["action"] == "mismatch"
            assert world.sent == []
            call = await effectd.get_tool_call("job-x", "c1")
            assert call.state is State.AWAITING_APPROVAL

    asyncio.run(body())


def test_a_rejection_in_effectd_reaches_the_model_and_nothing_runs(
    target: str,
) -> None:
    async def body() -> None:
        world = World()
        turns = [[("c1", "send", {"to": "ann"})]]
        async with AsyncClient(target) as effectd:
            mw = EffectdMiddleware(client=effectd, policy=APPROVAL, run_id="job-no")
            agent = agent_of(world, turns, [mw])
            session = agent.create_session()
            _, [pause] = await run(agent, session)
            await decide_request(
                effectd, pause, approve=False, approver="ann", reason="no"
            )
            seen, _ = await run(agent, session, resumed([pause]))
            assert seen["c1"].startswith("Error:")
            assert world.sent == []

    asyncio.run(body())


def test_a_tool_the_framework_requires_approval_of_needs_effectds_too(
    target: str,
) -> None:
    """`approval_mode="always_require"`: the framework asks first; its
    approval brings the call to the ledger, which waits for an approver."""

    async def body() -> None:
        world = World()
        turns = [[("c1", "wire", {"amount": 5})]]
        async with AsyncClient(target) as effectd:
            mw = EffectdMiddleware(client=effectd, run_id="job-wire")
            agent = agent_of(world, turns, [mw])
            session = agent.create_session()
            _, [pause] = await run(agent, session)
            assert facts_of(pause) is None  # the framework's own request
            _, [pause] = await run(agent, session, resumed([pause]))
            assert effectd_of(pause)["state"] == "AWAITING_APPROVAL"
            assert world.sent == []

    asyncio.run(body())


def test_negative_control_the_frameworks_approval_alone_runs_the_tool(
    target: str,
) -> None:
    """Without the middleware, the framework's own answer is the whole
    approval: the tool runs on it (what the test above refuses)."""

    async def body() -> None:
        world = World()
        agent = agent_of(world, [[("c1", "wire", {"amount": 5})]])
        session = agent.create_session()
        _, [pause] = await run(agent, session)
        seen, _ = await run(agent, session, resumed([pause]))
        assert seen == {"c1": "wired 5"}
        assert world.sent == ["wire 5"]

    asyncio.run(body())


def test_an_idempotent_write_reads_its_key_from_the_ledger(target: str) -> None:
    async def body() -> None:
        world = World()
        turns = [[("c1", "pay", {"amount": 3})]]
        async with AsyncClient(target) as effectd:
            mw = EffectdMiddleware(
                client=effectd,
                policy={"pay": Effect.IDEMPOTENT_WRITE},
                run_id="job-pay",
            )
            agent = agent_of(world, turns, [mw])
            seen, _ = await run(agent, agent.create_session())
            assert seen == {"c1": "paid 3"}
            assert world.keys == ["job-pay:c1"]

    asyncio.run(body())


def test_a_call_held_by_a_live_attempt_pauses_to_wait(daemon: RunningDaemon) -> None:
    """Another process holds the call (a live lease, the clock stands
    still): paused with `wait`, never run beside it; the run id comes from
    the declared function."""

    async def body() -> None:
        world = World()
        async with AsyncClient(daemon.target) as effectd:
            await effectd.prepare_tool("job-7", "c1", "send", {"to": "ann"}, start=True)
            mw = EffectdMiddleware(client=effectd, run_id=lambda ctx: "job-7")
            agent = agent_of(world, [[("c1", "send", {"to": "ann"})]], [mw])
            _, [pause] = await run(agent, agent.create_session())
            assert effectd_of(pause)["action"] == "wait"
            assert world.sent == []

    asyncio.run(body())


def test_a_run_without_a_session_or_run_id_is_refused(target: str) -> None:
    """No session, no run id: no ledger key, so the run fails closed before
    the tool runs (a fresh id per run would run the call again on a retry)."""

    async def body() -> None:
        world = World()
        async with AsyncClient(target) as effectd:
            agent = agent_of(
                world,
                [[("c1", "send", {"to": "ann"})]],
                [EffectdMiddleware(client=effectd)],
            )
            with pytest.raises(MiddlewareFailure, match="no session"):
                await agent.run("go", session=None)
            assert world.sent == []

    asyncio.run(body())


def test_a_stored_non_text_result_is_given_back_as_its_contents(
    target: str,
) -> None:
    """A committed result that is not text (another process's) reaches the
    model as its JSON; the tool does not run."""

    async def body() -> None:
        world = World()
        turns = [[("c1", "send", {"to": "ann"})]]
        async with AsyncClient(target) as effectd:
            await effectd.prepare_tool("job-j", "c1", "send", {"to": "ann"}, start=True)
            call = await effectd.get_tool_call("job-j", "c1")
            await effectd.commit_tool("job-j", "c1", call.attempt, {"id": 7})
            mw = EffectdMiddleware(client=effectd, run_id="job-j")
            seen, _ = await run(agent_of(world, turns, [mw]), AgentSession())
            assert json.loads(seen["c1"]) == {"id": 7}
            assert world.sent == []

    asyncio.run(body())


def test_importing_the_client_does_not_import_agent_framework() -> None:
    """The extra is imported only by `effectd_client.contrib.agent_framework`."""
    assert imported_by("import effectd_client", ["agent_framework"]) == []


def test_the_public_surface_is_pinned() -> None:
    assert sorted(effectd_agent_framework.__all__) == [
        "EffectdMiddleware",
        "METADATA_KEY",
        "PolicyError",
        "ToolDecision",
        "ToolPolicy",
        "ToolRule",
        "decide_request",
        "facts_of",
        "is_pause",
    ]
    assert METADATA_KEY == "effectd"
