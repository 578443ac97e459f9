"""A LangGraph agent for the crash tests: a StateGraph of a scripted chat
model and a ToolNode of two tools, checkpointed in SQLite, so that a process
can die in the middle of a tool and another one resume the thread.

The model is a langchain_core chat model that answers from the conversation
alone (the n-th answer for the n-th model turn), so a resumed process gets
the same tool calls, with the same ids, as a real model's checkpointed
message would give it. `book` is the side effect: each run appends a line to
`WORKDIR/effects`, the external counter. `search` only reads.

    python -m tests.clients.lg.agent TARGET WORKDIR THREAD [ledgered|plain]

runs the agent once (the crash tests' child); a file `WORKDIR/hold` makes
`book` stop after its effect (writing `WORKDIR/reached`) until it is killed,
and the environment variable CRASH_AFTER_APPROVAL makes the process die
right after an approval is recorded in effectd.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from effectd_client import Client
from effectd_client.contrib.langgraph import LedgeredToolCalls, ToolPolicy

# Held while `book` appends its line and counts the lines.
_COUNTING = threading.Lock()

THREAD_INPUT = "book a room in Paris"
# The model's answers, turn by turn: book, then search, then a final text.
SCRIPT = (
    {"name": "book", "args": {"city": "Paris"}, "id": "call-book-1"},
    {"name": "search", "args": {"q": "Paris hotels"}, "id": "call-search-1"},
)
POLICY = """
[tools.book]
effect = "side-effect"
[tools.search]
effect = "read"
"""
APPROVAL_POLICY = POLICY.replace(
    'effect = "side-effect"', 'effect = "side-effect"\nrequire_approval = true'
)


class ScriptedModel(BaseChatModel):
    """The model's n-th answer for its n-th turn in the conversation: the
    tool call (or list of parallel calls) of the script, then a final text."""

    script: Sequence[Any] = SCRIPT

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
        if turn < len(self.script):
            step = self.script[turn]
            calls = [dict(c) for c in step] if isinstance(step, list) else [dict(step)]
            answer = AIMessage(content="", tool_calls=calls)
        else:
            seen = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
            answer = AIMessage(content="done: " + " | ".join(seen))
        return ChatResult(generations=[ChatGeneration(message=answer)])


def tools(workdir: Path) -> list[Any]:
    @tool
    def book(city: str) -> str:
        """Books a room (the side effect, counted)."""
        # Parallel calls run in threads: each appends and counts in turn, so
        # each gets its own number.
        with _COUNTING, (workdir / "effects").open("a") as effects:
            effects.write(f"book {city}\n")
            effects.flush()
            n = len((workdir / "effects").read_text().splitlines())
        if (workdir / "hold").exists():
            (workdir / "reached").touch()
            time.sleep(60)  # killed here: after the effect, before the commit
        return f"booked {city} (#{n})"

    @tool
    def search(q: str) -> str:
        """Searches (a read)."""
        return f"3 results for {q}"

    return [book, search]


def build(
    saver: BaseCheckpointSaver[Any],
    node: ToolNode,
    script: Sequence[Any] = SCRIPT,
) -> Any:
    """The agent's graph: the model, and the tools node when it calls tools."""
    model = ScriptedModel(script=script)

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("model", call_model)
    g.add_node("tools", node)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


def effects(workdir: Path) -> int:
    """How many times `book` acted."""
    path = workdir / "effects"
    return len(path.read_text().splitlines()) if path.exists() else 0


def run(
    target: str,
    workdir: Path,
    thread: str,
    *,
    ledgered: bool = True,
    resume: Any = None,
    policy: str = POLICY,
    lease_ms: int = 1000,
) -> dict[str, Any]:
    """Runs the thread once (starting it, or resuming it from its checkpoint,
    or answering its interrupt with `resume`); what it ended with."""
    with (
        Client(target) as client,
        SqliteSaver.from_conn_string(str(workdir / "checkpoints.sqlite")) as saver,
    ):
        if ledgered:
            ledger = LedgeredToolCalls(
                client, policy=ToolPolicy.from_toml(policy), lease_ms=lease_ms
            )
            node = ledger.tool_node(tools(workdir))
        else:
            node = ToolNode(tools(workdir))
        graph = build(saver, node)
        config: Any = {"configurable": {"thread_id": thread}}
        inputs: Any = None
        if resume is not None:
            inputs = Command(resume=resume)
        elif saver.get_tuple(config) is None:
            inputs = {"messages": [HumanMessage(THREAD_INPUT)]}
        result = graph.invoke(inputs, config, durability="sync")
    return summary(result)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What a run ended with: its interrupts' values, the tool messages the
    model saw and its last words."""
    messages = result.get("messages", [])
    return {
        "interrupts": [i.value for i in result.get("__interrupt__", [])],
        "tools": [
            (m.tool_call_id, str(m.content), m.status)
            for m in messages
            if isinstance(m, ToolMessage)
        ],
        "final": str(messages[-1].content) if messages else "",
    }


def agent(target: str, workdir: str, thread: str) -> dict[str, Any]:
    """`run` as `effectd_client.testing.crash_and_resume` calls it."""
    return run(target, Path(workdir), thread)


def _crash_after_approval() -> None:
    decide = Client.decide_approval

    def decide_then_die(*args: Any, **kwargs: Any) -> Any:
        decide(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    Client.decide_approval = decide_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    target, workdir, thread = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    mode = sys.argv[4] if len(sys.argv) > 4 else "ledgered"
    resume = json.loads(os.environ["RESUME"]) if "RESUME" in os.environ else None
    if "CRASH_AFTER_APPROVAL" in os.environ:
        _crash_after_approval()
    out = run(
        target,
        workdir,
        thread,
        ledgered=mode == "ledgered",
        resume=resume,
        policy=os.environ.get("POLICY", POLICY),
    )
    print(json.dumps(out))
