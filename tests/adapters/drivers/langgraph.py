"""The LangGraph driver: a StateGraph of a scripted chat model and a
ToolNode, checkpointed in SQLite in the work directory (durability "sync");
the adapter is `LedgeredToolCalls.tool_node`, the control a plain ToolNode.
A pause is the graph's `__interrupt__`; an answer is `Command(resume=...)`;
a finished step is run again by forking the thread from the checkpoint
before its tools node (LangGraph's time travel)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from effectd_client import Client
from effectd_client.langgraph import LedgeredToolCalls, ToolPolicy, approve
from tests.adapters import world
from tests.adapters.drivers.base import Agent, Answer, Outcome, Paused, PauseKind

POLICY = '[tools.book]\neffect = "side-effect"\n'
APPROVAL = POLICY + "require_approval = true\n"
KINDS = {"approval": PauseKind.APPROVAL, "reconcile": PauseKind.RECONCILE}


class ScriptedModel(BaseChatModel):
    """The n-th answer for the n-th model turn of the conversation."""

    script: Any
    workdir: Any
    before_turn: Any = None
    client: Any = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        if self.before_turn is not None:
            self.before_turn(self.client)
        world.model_turn(self.workdir, turn, answered=False)
        if turn < len(self.script):
            calls = [
                {"name": "book", "args": {"item": c.item}, "id": c.call_id}
                for c in self.script[turn]
            ]
            answer = AIMessage(content="", tool_calls=calls)
        else:
            seen = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            answer = AIMessage(content=world.final_text(seen))
        world.model_turn(self.workdir, turn, answered=True)
        return ChatResult(generations=[ChatGeneration(message=answer)])


def _graph(agent: Agent, client: Client, saver: SqliteSaver) -> Any:
    workdir = agent.workdir

    @tool
    def book(item: str) -> str:
        """Books an item (the side effect)."""
        return world.book(workdir, item)

    if agent.wrapped:
        policy = ToolPolicy.from_toml(APPROVAL if agent.approval else POLICY)
        node = LedgeredToolCalls(client, policy=policy, lease_ms=1000).tool_node([book])
    else:
        node = ToolNode([book])
    model = ScriptedModel(
        script=agent.script,
        workdir=workdir,
        before_turn=agent.before_turn,
        client=client,
    )

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("model", call_model)
    g.add_node("tools", node)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


def _paused(values: Sequence[Any]) -> tuple[Paused, ...]:
    out = []
    for value in values:
        for call in value.get("calls", [value]):
            kind = KINDS.get(call.get("effectd"), PauseKind.OTHER)
            out.append(Paused(call["call_id"], kind, call["arguments"], call))
    return tuple(out)


def _outcome(result: dict[str, Any]) -> Outcome:
    paused = _paused([i.value for i in result.get("__interrupt__", [])])
    messages = result.get("messages", [])
    final = "" if paused or not messages else str(messages[-1].content)
    return Outcome(paused, final)


class LangGraphDriver:
    def __init__(self) -> None:
        self.name = "langgraph"
        self.not_applicable: dict[world.Scenario, str] = {}

    def _invoke(self, agent: Agent, inputs: Any, fork: bool = False) -> Outcome:
        path = str(agent.workdir / "checkpoints.sqlite")
        with Client(agent.target) as client, SqliteSaver.from_conn_string(path) as s:
            graph = _graph(agent, client, s)
            config: Any = {"configurable": {"thread_id": agent.run_id}}
            if fork:
                [before] = [
                    h for h in graph.get_state_history(config) if h.next == ("tools",)
                ][-1:]
                config = before.config
            elif inputs is None and s.get_tuple(config) is None:
                inputs = {"messages": [HumanMessage("book")]}
            return _outcome(graph.invoke(inputs, config, durability="sync"))

    def run(self, agent: Agent) -> Outcome:
        return self._invoke(agent, None)

    def restart(self, agent: Agent) -> None:
        (agent.workdir / "checkpoints.sqlite").unlink(missing_ok=True)

    def replay_step(self, agent: Agent) -> Outcome:
        return self._invoke(agent, None, fork=True)

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        if answer is Answer.DECIDED_IN_EFFECTD:
            value: Any = "decided"
        elif answer is Answer.FRAMEWORK_ONLY:
            # LangGraph's human-in-the-loop convention: an "accept" response.
            value = {"type": "accept", "args": None}
        else:
            edited = {**paused.raw, "arguments": {"item": "edited"}}
            value = approve(edited, approver="ann")
        return self._invoke(agent, Command(resume=value))


DRIVER = LangGraphDriver()
