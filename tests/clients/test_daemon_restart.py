"""A daemon killed with SIGKILL and started again (a real `effectd serve` on
the same data directory and socket) between two steps of a running agent:
the agent's next request finds no daemon, waits for it, and the agent
finishes, every side effect run exactly once (counted in a file, or by the
MCP server's process). For the safe call (`Run`, `AsyncRun`) and each
adapter: LangGraph's `LedgeredToolCalls`, the Agents SDK's `AgentLedger`,
Pydantic AI's `EffectdToolset` and MCP's `LedgeredSession`, each with a
scripted model of its framework (no network). The negative control is the
same run with a client that does not wait (`reconnect_wait=0`): the agent
dies at the restart with UNAVAILABLE.

`tests.support.restarts` kills and restarts the daemon at the agent's step
`AT`, once the client has seen its connection go."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import (
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from effectd_client import AsyncClient, AsyncRun, Client, EffectdError, Run
from effectd_client.contrib.langgraph import LedgeredToolCalls
from effectd_client.contrib.mcp import LedgeredSession
from effectd_client.contrib.openai_agents import AgentLedger
from effectd_client.contrib.pydantic_ai import EffectdToolset
from tests.clients.lg.agent import ScriptedModel as ScriptedChatModel
from tests.clients.mcp.servers import connect, executions
from tests.support.restarts import (
    BOUND,
    Restarts,
    Steps,
    effect,
    effects,
    restarting,
    waits,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
set_tracing_disabled(True)

CITIES = ("Paris", "Rome", "Oslo")
BOOKED = [f"book {city}" for city in CITIES]
# The step before which the daemon restarts: the second booking's.
AT = 2


@pytest.fixture(scope="module")
def daemon() -> Iterator[Restarts]:
    """One daemon process for the module, restarted by each test: a test's
    agent begins on the daemon the test before it started again."""
    with (
        tempfile.TemporaryDirectory(prefix="effectd-", dir="/tmp") as tmp,
        restarting(Path(tmp) / "data") as running,
    ):
        yield running


@pytest.fixture
def restarts(daemon: Restarts) -> Restarts:
    daemon.ready()
    return daemon


@pytest.fixture
def run_id(short_tmp: Path) -> str:
    """Each test's agent run (the daemon keeps every test's)."""
    return f"trip-{short_tmp.name}"


@pytest.fixture
def booked(short_tmp: Path) -> Path:
    """The external system: one line per booking."""
    return short_tmp / "effects"


@pytest.fixture(autouse=True)
def _warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "effectd_client")


def finished(
    restarts: Restarts, booked: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The property: the daemon restarted under the agent, which waited for
    it once, and booked each city exactly once."""
    assert restarts.kills == 1
    assert len(waits(caplog)) == 1
    assert effects(booked) == BOOKED


def patient(target: str, **options: Any) -> Client:
    """A client that waits for the daemon as long as it may take to start
    on a loaded machine (bounded)."""
    return Client(target, timeout=BOUND, reconnect_wait=BOUND, **options)


def apatient(target: str) -> AsyncClient:
    return AsyncClient(target, timeout=BOUND, reconnect_wait=BOUND)


def booking(booked: Path) -> Callable[[str], Awaitable[str]]:
    """The async agents' tool: books a room, a line in `booked`."""

    async def book(city: str) -> str:
        """Books a room (the side effect)."""
        effect(booked, f"book {city}")
        return f"booked {city}"

    return book


# -- the safe call ------------------------------------------------------------


def book_each(client: Client, booked: Path, step: Steps, run_id: str) -> list[str]:
    """The agent: books each city, a step each."""

    @Run(client, run_id).tool("book")
    def book(city: str) -> str:
        effect(booked, f"book {city}")
        return f"booked {city}"

    answers = []
    for city in CITIES:
        step()
        answers.append(book(city))
    return answers


@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
def test_a_run_finishes_across_a_daemon_restart(
    restarts: Restarts,
    run_id: str,
    booked: Path,
    session: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with patient(restarts.target, session=session) as client:
        answers = book_each(client, booked, restarts.steps(client, at=AT), run_id)
    assert answers == [f"booked {city}" for city in CITIES]
    finished(restarts, booked, caplog)


def test_negative_control_a_run_whose_client_does_not_wait_dies_at_the_restart(
    restarts: Restarts, run_id: str, booked: Path
) -> None:
    """Today's failure: the request after the restart is UNAVAILABLE."""
    client = Client(restarts.target, timeout=BOUND, reconnect_wait=0)
    with client, pytest.raises(EffectdError) as raised:
        book_each(client, booked, restarts.steps(client, at=AT), run_id)
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert effects(booked) == BOOKED[: AT - 1]


def test_an_async_run_finishes_across_a_daemon_restart(
    restarts: Restarts, run_id: str, booked: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def agent() -> list[str]:
        async with apatient(restarts.target) as client:
            step = restarts.steps(client, at=AT)
            book = AsyncRun(client, run_id).tool("book")(booking(booked))
            answers = []
            for city in CITIES:
                await step.step()
                answers.append(await book(city))
            return answers

    assert asyncio.run(agent()) == [f"booked {city}" for city in CITIES]
    finished(restarts, booked, caplog)


# -- the adapters: a scripted model books each city, a turn each ----------------


def test_a_langgraph_agent_finishes_across_a_daemon_restart(
    restarts: Restarts, run_id: str, booked: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @tool
    def book(city: str) -> str:
        """Books a room (the side effect)."""
        effect(booked, f"book {city}")
        return f"booked {city}"

    script = [
        {"name": "book", "args": {"city": city}, "id": f"call-{city}"}
        for city in CITIES
    ]
    model = ScriptedChatModel(script=script)
    with patient(restarts.target) as client:
        step = restarts.steps(client, at=AT)

        def call_model(state: MessagesState) -> dict[str, Any]:
            step()
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", call_model)
        graph.add_node("tools", LedgeredToolCalls(client).tool_node([book]))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition, ["tools", END])
        graph.add_edge("tools", "model")
        result = graph.compile(checkpointer=InMemorySaver()).invoke(
            {"messages": [HumanMessage("book three rooms")]},
            {"configurable": {"thread_id": run_id}},
            durability="sync",
        )
    assert str(result["messages"][-1].content).startswith("done: booked Paris")
    finished(restarts, booked, caplog)


def test_an_openai_agents_agent_finishes_across_a_daemon_restart(
    restarts: Restarts, run_id: str, booked: Path, caplog: pytest.LogCaptureFixture
) -> None:
    book = function_tool(booking(booked), failure_error_function=None)

    async def agent() -> str:
        async with apatient(restarts.target) as client:
            step = restarts.steps(client, at=AT)
            turns = iter(CITIES)

            async def answer(call: ModelCall) -> Any:
                await step.step()
                city = next(turns, None)
                if city is None:
                    return [assistant_message("all booked")]
                return [function_call("book", {"city": city}, call_id=f"c-{city}")]

            ledger = AgentLedger(client)
            model = ScriptedModel([ModelStep.respond(answer) for _ in range(4)])
            agent = Agent(name="trip", model=model, tools=[ledger.tool(book)])
            with ledger.run(run_id):
                result = await Runner.run(agent, "book three rooms")
            return str(result.final_output)

    assert asyncio.run(agent()) == "all booked"
    finished(restarts, booked, caplog)


def test_a_pydantic_ai_agent_finishes_across_a_daemon_restart(
    restarts: Restarts, run_id: str, booked: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def agent() -> str:
        async with apatient(restarts.target) as client:
            step = restarts.steps(client, at=AT)

            async def model(messages: list[ModelMessage], info: AgentInfo) -> Any:
                await step.step()
                asked = sum(
                    isinstance(p, ToolCallPart)
                    for m in messages
                    if isinstance(m, ModelResponse)
                    for p in m.parts
                )
                if asked == len(CITIES):
                    return ModelResponse(parts=[TextPart("all booked")])
                city = CITIES[asked]
                call = ToolCallPart("book", {"city": city}, tool_call_id=f"c-{city}")
                return ModelResponse(parts=[call])

            tools = EffectdToolset(
                FunctionToolset([booking(booked)]), client=client, run_id=run_id
            )
            agent = PydanticAgent(FunctionModel(model), toolsets=[tools])
            return (await agent.run("book three rooms")).output

    assert asyncio.run(agent()) == "all booked"
    finished(restarts, booked, caplog)


def test_an_mcp_agent_finishes_across_a_daemon_restart(
    restarts: Restarts, run_id: str, short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The side effect is the MCP server's (a process of its own): it counts
    its executions of `send`."""
    server = short_tmp / "server"
    server.mkdir()

    async def agent() -> None:
        async with apatient(restarts.target) as client, connect("stdio", server) as mcp:
            step = restarts.steps(client, at=AT)
            tools = LedgeredSession(mcp, AsyncRun(client, run_id), server="counter")
            for i, to in enumerate(("ann", "bob", "cyd")):
                await step.step()
                result = await tools.call_tool("send", {"to": to}, call_id=f"tc-{i}")
                assert not result.is_error

    asyncio.run(agent())
    assert restarts.kills == 1
    assert len(waits(caplog)) == 1
    assert executions(server, "send") == 3
