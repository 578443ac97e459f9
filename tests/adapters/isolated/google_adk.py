"""The Google ADK driver, run in `.venv-adk` (`VenvDriver`): an `LlmAgent`
of a scripted `BaseLlm` and the tool `book` (an async function, so that
parallel calls held in it run side by side), wrapped in `LedgeredTool`; an
`App` with resumability, its sessions in SQLite in the work directory
(`SqliteSessionService`). A run resumes the session's last invocation
(`run_async(invocation_id=...)`: ADK runs the calls it left unanswered),
or answers the tool confirmations it paused on; a finished step runs again
by rewinding the session to before its invocation (`Runner.rewind_async`)
and sending the same message again."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

from effectd_client import AsyncClient
from effectd_client.contrib.google_adk import (
    CONFIRMATION_CALL,
    PAUSE_KEY,
    LedgeredTool,
    StillWaiting,
    ToolPolicy,
    paused_calls,
)
from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind

APP, USER = "conformance", "user"
SESSIONS = "adk-sessions.sqlite"
POLICY = '[tools.book]\neffect = "side-effect"\n'
APPROVAL = POLICY + "require_approval = true\n"
KINDS = {"approve": PauseKind.APPROVAL, "reconcile": PauseKind.RECONCILE}
# Resumes of a run paused to wait for a lease, this far apart.
WAITS, WAIT_SECONDS = 40, 0.25


class ScriptedModel(BaseLlm):  # type: ignore[misc]  # ADK's types live in .venv-adk
    """The n-th answer for the n-th model turn of the conversation."""

    model: str = "scripted"
    agent: Any = None
    client: Any = None

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        agent: Agent = self.agent
        turn = sum(c.role == "model" for c in llm_request.contents)
        if agent.before_turn is not None:
            stepped = agent.before_turn(self.client)
            if inspect.isawaitable(stepped):
                await stepped
        world.model_turn(agent.workdir, turn, answered=False)
        if turn < len(agent.script):
            parts = [
                types.Part(
                    function_call=types.FunctionCall(
                        id=c.call_id, name="book", args={"item": c.item}
                    )
                )
                for c in agent.script[turn]
            ]
        else:
            seen = {
                p.function_response.id: str(
                    (p.function_response.response or {})["result"]
                )
                for c in llm_request.contents
                for p in c.parts or []
                if p.function_response is not None
            }
            order = [c.call_id for t in agent.script for c in t]
            parts = [
                types.Part(text=world.final_text([seen[c] for c in order if c in seen]))
            ]
        world.model_turn(agent.workdir, turn, answered=True)
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def _tool(agent: Agent, client: AsyncClient) -> BaseTool:
    workdir = agent.workdir

    async def book(item: str) -> str:
        """Books an item (the side effect)."""
        return await asyncio.to_thread(world.book, workdir, item)

    if not agent.wrapped:
        return FunctionTool(book)
    return LedgeredTool(
        book,
        client=client,
        policy=ToolPolicy.from_toml(APPROVAL if agent.approval else POLICY),
        run_id=agent.run_id,
        lease_ms=1000,
        in_progress_wait=10.0,
    )


def _outcome(events: list[Any]) -> Outcome:
    paused = []
    for p in paused_calls(events):
        facts = p.get(PAUSE_KEY) or {}
        kind = KINDS.get(str(facts.get("action")), PauseKind.OTHER)
        paused.append(Paused(str(p["call_id"]), kind, p["arguments"], p))
    if paused:
        return Outcome(tuple(paused))
    for event in reversed(events):
        texts = [
            p.text
            for p in (event.content.parts if event.content else None) or []
            if p.text
        ]
        if event.author != USER and texts:
            return Outcome(final="".join(texts))
    return Outcome()


def _answers(pending: list[dict[str, Any]], payload: Any = None) -> types.Content:
    """The user's answers to the tool confirmations the run paused on."""
    response: dict[str, Any] = {"confirmed": True}
    if payload is not None:
        response["payload"] = payload
    return types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    id=p["confirmation_id"], name=CONFIRMATION_CALL, response=response
                )
            )
            for p in pending
        ],
    )


class GoogleAdkDriver:
    def __init__(self) -> None:
        self.name = "google_adk"
        self.not_applicable: dict[world.Scenario, str] = {}

    async def _run(
        self, agent: Agent, *, payload: Any = None, rewind: bool = False
    ) -> Outcome:
        sessions = SqliteSessionService(db_path=str(agent.workdir / SESSIONS))
        async with AsyncClient(agent.target) as client:
            model = ScriptedModel(agent=agent, client=client)
            root = LlmAgent(name="agent", model=model, tools=[_tool(agent, client)])
            app = App(
                name=APP,
                root_agent=root,
                resumability_config=ResumabilityConfig(is_resumable=True),
            )
            runner = Runner(app=app, session_service=sessions)
            sid = agent.run_id
            session = await sessions.get_session(
                app_name=APP, user_id=USER, session_id=sid
            )
            message: types.Content | None = None
            invocation: str | None = None
            if session is None:
                await sessions.create_session(
                    app_name=APP, user_id=USER, session_id=sid
                )
                message = types.Content(role="user", parts=[types.Part(text="book")])
            elif rewind:
                first = session.events[0].invocation_id
                await runner.rewind_async(
                    user_id=USER, session_id=sid, rewind_before_invocation_id=first
                )
                message = types.Content(role="user", parts=[types.Part(text="book")])
            else:
                pending = paused_calls(session.events)
                if pending:
                    message = _answers(pending, payload)
                elif session.events:
                    invocation = session.events[-1].invocation_id
            try:
                async for _ in runner.run_async(
                    user_id=USER,
                    session_id=sid,
                    new_message=message,
                    invocation_id=invocation,
                ):
                    pass
            except StillWaiting:
                pass  # the pause stays open: the session's events show it
            done = await sessions.get_session(
                app_name=APP, user_id=USER, session_id=sid
            )
            assert done is not None
            return _outcome(done.events)

    def run(self, agent: Agent) -> Outcome:
        """A call paused to wait (another attempt's lease, a killed
        process's, still live) is resumed again once the lease is out."""
        for _ in range(WAITS):
            out = asyncio.run(self._run(agent))
            if not out.paused or any(p.kind is not PauseKind.OTHER for p in out.paused):
                return out
            time.sleep(WAIT_SECONDS)
        return out

    def restart(self, agent: Agent) -> None:
        (agent.workdir / SESSIONS).unlink(missing_ok=True)

    def replay_step(self, agent: Agent) -> Outcome:
        return asyncio.run(self._run(agent, rewind=True))

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        if answer is Answer.EDITED:
            return asyncio.run(
                self._run(agent, payload={"arguments": {"item": "edited"}})
            )
        # ADK's own "confirmed" (after a decision in effectd, or alone).
        return asyncio.run(self._run(agent))


DRIVER = GoogleAdkDriver()
