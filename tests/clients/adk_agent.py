"""An ADK agent for tests/clients/test_google_adk.py, run in `.venv-adk`
(ADK's pins cannot live beside the daemon's):

    python -m tests.clients.adk_agent TARGET WORKDIR SESSION [ANSWER]

A scripted `BaseLlm` calls `look(city)` (a READ in the policy) and
`book(item)` (named nowhere: a SIDE_EFFECT, with approval by the policy's
default) in one response, then answers every tool result it saw. The
session lives in SQLite in WORKDIR; ANSWER (`decide`, `decide-edited`,
`confirm`) answers the pause the last run left. Prints one JSON line: the
pauses, the model's final text, and what `decide` raised."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types

from effectd_client import AsyncClient
from effectd_client.contrib.google_adk import (
    CONFIRMATION_CALL,
    ApprovalMismatch,
    LedgeredTool,
    StillWaiting,
    ToolPolicy,
    decide,
    paused_calls,
)

POLICY = """
require_approval = true

[tools.look]
effect = "read"
require_approval = false
"""
APP, USER = "tests", "user"


class Scripted(BaseLlm):  # type: ignore[misc]  # ADK's types live in .venv-adk
    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        if not any(c.role == "model" for c in llm_request.contents):
            calls = [("m1", "look", {"city": "Oslo"}), ("m2", "book", {"item": "room"})]
            parts = [
                types.Part(function_call=types.FunctionCall(id=i, name=n, args=a))
                for i, n, a in calls
            ]
        else:
            seen = [
                json.dumps(p.function_response.response, sort_keys=True)
                for c in llm_request.contents
                for p in c.parts or []
                if p.function_response is not None
            ]
            parts = [types.Part(text=" | ".join(seen))]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


async def main(target: str, workdir: Path, session_id: str, answer: str) -> None:
    ran = workdir / "ran"

    def look(city: str) -> str:
        """Looks a city up."""
        return f"sunny in {city}"

    def book(item: str) -> str:
        """Books an item."""
        with ran.open("a") as f:
            f.write(item + "\n")
        return f"booked {item}"

    sessions = SqliteSessionService(db_path=str(workdir / "sessions.sqlite"))
    out: dict[str, Any] = {}
    async with AsyncClient(target) as client:
        policy = ToolPolicy.from_toml(POLICY)
        tools = [LedgeredTool(t, client=client, policy=policy) for t in (look, book)]
        agent = LlmAgent(name="agent", model=Scripted(), tools=tools)
        app = App(
            name=APP,
            root_agent=agent,
            resumability_config=ResumabilityConfig(is_resumable=True),
        )
        runner = Runner(app=app, session_service=sessions)
        session = await sessions.get_session(
            app_name=APP, user_id=USER, session_id=session_id
        )
        if session is None:
            await sessions.create_session(
                app_name=APP, user_id=USER, session_id=session_id
            )
            message = types.Content(role="user", parts=[types.Part(text="go")])
        else:
            [paused] = paused_calls(session.events)
            if answer.startswith("decide"):
                shown = {"item": "suite"} if answer == "decide-edited" else None
                try:
                    await decide(
                        client,
                        paused,
                        approve=True,
                        approver="ann",
                        reason="ok",
                        arguments=shown or paused["arguments"],
                    )
                except ApprovalMismatch as refused:
                    out["refused"] = str(refused)
            response = {"confirmed": True}
            message = types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            id=paused["confirmation_id"],
                            name=CONFIRMATION_CALL,
                            response=response,
                        )
                    )
                ],
            )
        try:
            async for _ in runner.run_async(
                user_id=USER, session_id=session_id, new_message=message
            ):
                pass
        except StillWaiting as waiting:
            out["still_waiting"] = waiting.facts["action"]
        done = await sessions.get_session(
            app_name=APP, user_id=USER, session_id=session_id
        )
        assert done is not None
        out["paused"] = paused_calls(done.events)
        texts = [
            p.text
            for e in done.events
            if e.author != USER and e.content
            for p in e.content.parts or []
            if p.text
        ]
        out["final"] = texts[-1] if texts else ""
    print(json.dumps(out))


if __name__ == "__main__":
    args = [*sys.argv[1:], ""]
    asyncio.run(main(args[0], Path(args[1]), args[2], args[3]))
