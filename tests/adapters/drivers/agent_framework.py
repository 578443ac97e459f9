"""The Agent Framework driver: an `Agent` of a scripted chat client (the
framework's own `BaseChatClient` with its function-invocation and chat
middleware layers, no network) and the function tool `book`, with
`EffectdMiddleware` as its function middleware (the control: none). The
framework persists a session at the end of a run, so the driver saves
`session.to_dict()` then, with the run's pauses (`user_input_requests`);
a run resumed answers every pause with the framework's
`to_function_approval_response(approved=True)` (which brings the call back
to the middleware: not an approval), and a run killed before its end starts
its turn again from the session as it was (the model makes the same calls).
A finished step runs again the framework's way: its turn run again from
the session saved before it."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Sequence
from typing import Any

from agent_framework import (
    Agent as FrameworkAgent,
)
from agent_framework import (
    AgentSession,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
    tool,
)

from effectd_client import AsyncClient
from effectd_client.contrib.agent_framework import (
    EffectdMiddleware,
    ToolPolicy,
    facts_of,
)
from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind

SESSION, BEFORE, PENDING = "session.json", "before.json", "pending.json"
POLICY = '[tools.book]\neffect = "side-effect"\n'
APPROVAL = POLICY + "require_approval = true\n"
KINDS = {"approve": PauseKind.APPROVAL, "reconcile": PauseKind.RECONCILE}
# Resumes of a run paused to wait for a lease, this far apart.
WAITS, WAIT_SECONDS = 40, 0.25


class ScriptedChatClient(
    FunctionInvocationLayer[Any], ChatMiddlewareLayer[Any], BaseChatClient[Any]
):
    """The script as a chat client: its n-th model turn makes the n-th
    turn's calls, then a text of every tool result it saw."""

    def __init__(self, agent: Agent, client: AsyncClient) -> None:
        super().__init__()
        self.agent, self.effectd = agent, client

    async def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Any, **kw: Any
    ) -> ChatResponse[Any]:
        assert not stream
        agent = self.agent
        turn = sum(
            m.role == "assistant"
            and any(c.type in ("function_call", "text") for c in m.contents)
            for m in messages
        )
        if agent.before_turn is not None:
            stepped = agent.before_turn(self.effectd)
            if inspect.isawaitable(stepped):
                await stepped
        world.model_turn(agent.workdir, turn, answered=False)
        if turn < len(agent.script):
            contents = [
                Content.from_function_call(
                    call_id=c.call_id, name="book", arguments={"item": c.item}
                )
                for c in agent.script[turn]
            ]
        else:
            seen = {
                c.call_id: str(c.result)
                for m in messages
                for c in m.contents
                if c.type == "function_result"
            }
            order = [c.call_id for t in agent.script for c in t]
            text = world.final_text([seen[c] for c in order if c in seen])
            contents = [Content.from_text(text)]
        world.model_turn(agent.workdir, turn, answered=True)
        return ChatResponse(messages=[Message(role="assistant", contents=contents)])


def _framework(agent: Agent, client: AsyncClient) -> FrameworkAgent[Any]:
    workdir = agent.workdir

    @tool(name="book")
    async def book(item: str) -> str:
        """Books an item (the side effect); in a thread, so that parallel
        calls held in it do not hold the event loop."""
        return await asyncio.to_thread(world.book, workdir, item)

    middleware: list[Any] = []
    if agent.wrapped:
        policy = ToolPolicy.from_toml(APPROVAL if agent.approval else POLICY)
        middleware.append(
            EffectdMiddleware(
                client=client, policy=policy, run_id=agent.run_id, lease_ms=1000
            )
        )
    return FrameworkAgent(
        client=ScriptedChatClient(agent, client), tools=[book], middleware=middleware
    )


def _paused(requests: Sequence[Content]) -> Outcome:
    paused = []
    for request in requests:
        facts = facts_of(request) or {}
        kind = KINDS.get(str(facts.get("action")), PauseKind.OTHER)
        if facts_of(request) is None and request.type == "function_approval_request":
            kind = PauseKind.APPROVAL
        call = request.function_call
        assert call is not None
        assert call.call_id is not None
        args = call.parse_arguments() or {}
        paused.append(Paused(call.call_id, kind, dict(args), request))
    return Outcome(tuple(paused))


class AgentFrameworkDriver:
    def __init__(self) -> None:
        self.name = "agent_framework"
        self.not_applicable: dict[world.Scenario, str] = {}

    def _load(self, agent: Agent, name: str) -> Any:
        path = agent.workdir / name
        return json.loads(path.read_text()) if path.exists() else None

    def _save(self, agent: Agent, name: str, value: Any) -> None:
        (agent.workdir / name).write_text(json.dumps(value))

    async def _run(self, agent: Agent, answers: list[Content] | None) -> Outcome:
        async with AsyncClient(agent.target) as client:
            framework = _framework(agent, client)
            saved = self._load(agent, SESSION)
            if saved is None:
                session = framework.create_session()
            else:
                session = AgentSession.from_dict(saved)
            pending = [Content.from_dict(d) for d in self._load(agent, PENDING) or []]
            given: Any
            if answers is not None:
                given = Message(role="user", contents=answers)
            elif pending:
                given = Message(
                    role="user",
                    contents=[p.to_function_approval_response(True) for p in pending],
                )
            else:
                self._save(agent, BEFORE, session.to_dict())
                given = "book"
            response = await framework.run(given, session=session)
            self._save(agent, SESSION, session.to_dict())
            requests = list(response.user_input_requests)
            self._save(agent, PENDING, [r.to_dict() for r in requests])
            if requests:
                return _paused(requests)
            return Outcome(final=response.text)

    def run(self, agent: Agent) -> Outcome:
        """A run paused to wait (another attempt's lease, a killed process's,
        still live) is resumed again once the lease is out."""
        for _ in range(WAITS):
            out = asyncio.run(self._run(agent, None))
            if not out.paused or any(p.kind is not PauseKind.OTHER for p in out.paused):
                return out
            time.sleep(WAIT_SECONDS)
        return out

    def restart(self, agent: Agent) -> None:
        for name in (SESSION, BEFORE, PENDING):
            (agent.workdir / name).unlink(missing_ok=True)

    def replay_step(self, agent: Agent) -> Outcome:
        before = self._load(agent, BEFORE)
        self.restart(agent)
        if before is not None:
            self._save(agent, SESSION, before)
        return self.run(agent)

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        if answer is not Answer.EDITED:
            return self.run(agent)
        request: Content = paused.raw
        call = request.function_call
        assert call is not None
        edited = Content.from_function_call(
            call_id=call.call_id or paused.call_id,
            name=call.name or "book",
            arguments={"item": "edited"},
            id=call.id,
        )
        response = Content.from_function_approval_response(
            True, id=request.id or "", function_call=edited
        )
        return asyncio.run(self._run(agent, [response]))


DRIVER = AgentFrameworkDriver()
