"""The MCP driver: the agent is an MCP client (`mcp.Client`, the `mcp`
package's in-memory transport to an `MCPServer` in the agent's process, so
that a kill point in the tool kills the agent) whose scripted model decides
the calls; the adapter is `LedgeredSession` around the client's session, the
control the bare `ClientSession.call_tool`. The calls of one model response
are sent together (`asyncio.gather`), and every call's verdict is kept: a
pause names them all.

MCP has no agent loop of its own: the host's transcript (each model
response and each tool result) is saved in the work directory after every
step, as a host's conversation store would, and a run resumes from it,
sending the calls still without a result again under their call ids. A
pause is what `call_tool` raises for a call (`ApprovalPending`,
`ReconciliationNeeded`; `CallInProgress` while a killed attempt's lease
runs, resumed again once it is out). A finished step runs again from the
transcript cut after the model response that made its calls.

MCP has no approval of its own (a host's consent is outside the protocol):
the only approval is effectd's. A human's edit of the shown arguments is the
host sending the call again with the edited arguments under its call id."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from typing import Any

from mcp import Client as McpClient
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult

from effectd_client import (
    ApprovalPending,
    AsyncClient,
    AsyncRun,
    CallInProgress,
    InputMismatch,
    ReconciliationNeeded,
)
from effectd_client.contrib.mcp import LedgeredSession, McpPolicy, unwrapped
from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind

HISTORY = "transcript.json"
SERVER = "booking"
POLICY = f'[servers.{SERVER}.tools.book]\neffect = "side-effect"\n'
APPROVAL = POLICY + "require_approval = true\n"
# Resumes of a run waiting for a killed attempt's lease, this far apart.
WAITS, WAIT_SECONDS = 40, 0.25
KINDS = {ReconciliationNeeded: PauseKind.RECONCILE, ApprovalPending: PauseKind.APPROVAL}


def _server(agent: Agent) -> MCPServer:
    server = MCPServer(SERVER)
    workdir = agent.workdir

    @server.tool()
    async def book(item: str) -> str:
        """Books an item (the side effect); in a thread, so that parallel
        calls held in it do not hold the event loop."""
        return await asyncio.to_thread(world.book, workdir, item)

    return server


def text_of(result: CallToolResult) -> str:
    return " ".join(str(getattr(c, "text", "")) for c in result.content)


class Transcript:
    """The host's conversation: model responses (calls, or a final text)
    and the result of each call, in a file of the work directory."""

    def __init__(self, agent: Agent) -> None:
        self.path = agent.workdir / HISTORY
        saved = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.responses: list[dict[str, Any]] = saved.get("responses", [])
        self.results: dict[str, str] = saved.get("results", {})

    def save(self) -> None:
        data = {"responses": self.responses, "results": self.results}
        self.path.write_text(json.dumps(data))

    def pending(self) -> list[tuple[str, str]]:
        if not self.responses:
            return []
        calls = self.responses[-1].get("calls", [])
        return [(c, i) for c, i in calls if c not in self.results]


async def _model_turn(agent: Agent, client: AsyncClient, t: Transcript) -> None:
    """The scripted model answers the transcript: its next turn's calls,
    or the final text of every result it saw."""
    turn = len(t.responses)
    if agent.before_turn is not None:
        stepped = agent.before_turn(client)
        if inspect.isawaitable(stepped):
            await stepped
    world.model_turn(agent.workdir, turn, answered=False)
    if turn < len(agent.script):
        answer: dict[str, Any] = {
            "calls": [[c.call_id, c.item] for c in agent.script[turn]]
        }
    else:
        order = [c.call_id for turn in agent.script for c in turn]
        seen = [t.results[c] for c in order if c in t.results]
        answer = {"text": world.final_text(seen)}
    world.model_turn(agent.workdir, turn, answered=True)
    t.responses.append(answer)
    t.save()


def _paused(call_id: str, item: str, error: BaseException) -> Paused:
    kind = next((k for e, k in KINDS.items() if isinstance(error, e)), PauseKind.OTHER)
    return Paused(call_id, kind, {"item": item}, error)


# What MCP cannot do, for the Python and the Node wrapper alike.
NOT_APPLICABLE = {
    world.Scenario.APPROVAL_FRAMEWORK: (
        "MCP has no approval of its own (a host's consent is outside "
        "the protocol): effectd's is the only one"
    ),
}


def call_tool_result(text: str) -> Any:
    """What an operator records for an MCP call found to have run: the
    CallToolResult the wrappers return (the daemon refuses another shape)."""
    return {"content": [{"type": "text", "text": text}], "isError": False}


class McpDriver:
    def __init__(self) -> None:
        self.name = "mcp"
        self.not_applicable = dict(NOT_APPLICABLE)

    def recorded_result(self, text: str) -> Any:
        return call_tool_result(text)

    async def _run(self, agent: Agent, edited: str | None = None) -> Outcome:
        t = Transcript(agent)
        policy = McpPolicy.from_toml(APPROVAL if agent.approval else POLICY)
        with unwrapped():
            async with (
                AsyncClient(agent.target) as client,
                McpClient(_server(agent)) as mcp,
            ):
                run = AsyncRun(client, agent.run_id, lease_ms=1000)
                tools = LedgeredSession(mcp.session, run, server=SERVER, policy=policy)
                if edited is not None:
                    [(call_id, _)] = t.pending()
                    args = {"item": edited}
                    await tools.call_tool("book", args, call_id=call_id)
                    return await self._run(agent)  # it ran: the scenario sees it

                async def call(call_id: str, item: str) -> CallToolResult:
                    if not agent.wrapped:
                        return await mcp.session.call_tool("book", {"item": item})
                    return await tools.call_tool(
                        "book", {"item": item}, call_id=call_id
                    )

                for _ in range(len(agent.script) + 2):
                    if t.responses and "text" in t.responses[-1]:
                        return Outcome(final=str(t.responses[-1]["text"]))
                    pending = t.pending()
                    if pending:
                        outs = await asyncio.gather(
                            *(call(c, i) for c, i in pending), return_exceptions=True
                        )
                        paused = []
                        for (c, i), out in zip(pending, outs, strict=True):
                            if isinstance(out, CallToolResult):
                                t.results[c] = text_of(out)
                            elif isinstance(
                                out,
                                (ApprovalPending, ReconciliationNeeded, CallInProgress),
                            ):
                                paused.append(_paused(c, i, out))
                            else:
                                raise out
                        t.save()
                        if paused:
                            return Outcome(tuple(paused))
                    await _model_turn(agent, client, t)
        raise AssertionError("the agent loop did not end")

    def run(self, agent: Agent) -> Outcome:
        """A call waiting for a killed attempt's lease is resumed again once
        the lease is out, the host's choice: the calls of a step killed
        together turn unknown one by one (each lease was last renewed at its
        own heartbeat), and one pause names them all."""
        for _ in range(WAITS):
            out = asyncio.run(self._run(agent))
            if not any(p.kind is PauseKind.OTHER for p in out.paused):
                return out
            time.sleep(WAIT_SECONDS)
        return out

    def restart(self, agent: Agent) -> None:
        (agent.workdir / HISTORY).unlink(missing_ok=True)

    def replay_step(self, agent: Agent) -> Outcome:
        t = Transcript(agent)
        t.responses, t.results = t.responses[:1], {}
        t.save()
        return self.run(agent)

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        if answer is Answer.EDITED:
            # Refused before the server is called; resumed, it is asked again.
            with contextlib.suppress(InputMismatch):
                return asyncio.run(self._run(agent, edited="edited"))
        return self.run(agent)


DRIVER = McpDriver()
