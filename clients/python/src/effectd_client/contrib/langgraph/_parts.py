"""What `effectd_client.contrib.langgraph` keeps and shows: a tool's output as a
ledger result and back, the identity of a tool call in a graph run, and the
interrupts it raises for a human, with the answers they resume with.

A tool's output (a `ToolMessage`, or a `Command` that updates the graph's
state) is stored whole with LangGraph's own checkpoint serializer, so a replay
gives the graph exactly what the first run gave it; the stored JSON also shows
the content and status for an operator reading the ledger.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command

from effectd_client import CallRejected, Effect, ToolCall, ToolFailed
from effectd_client.policy import ToolDecision

# The error code of a tool whose ToolNode turned its failure into a
# `ToolMessage` with status "error": the tool ran, and that is its result.
TOOL_ERROR = "LANGGRAPH_TOOL_ERROR"
# The key of an interrupt's value that says it comes from effectd.
KIND = "effectd"

_SERDE = JsonPlusSerializer()


class ApprovalMismatch(ValueError):
    """A resume value approves another call than the one waiting, or shows
    other arguments than effectd recorded for it: an approval covers the
    exact call (run, call id, arguments) it was given for, as shown."""


@dataclass(frozen=True, slots=True)
class GraphToolCall:
    """A tool call of a graph run, as the ledger knows it."""

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    decision: ToolDecision


def thread_run_id(config: RunnableConfig) -> str:
    """The default run id of a graph run: its `configurable.thread_id`."""
    thread = (config.get("configurable") or {}).get("thread_id")
    if thread is None or str(thread) == "":
        raise ValueError(
            "a ledgered tool call needs the graph run's thread id: compile the "
            "graph with a checkpointer and invoke it with "
            "config={'configurable': {'thread_id': ...}}"
        )
    return str(thread)


def stored(output: ToolMessage | Command[Any]) -> dict[str, Any]:
    """The ledger's JSON of a tool's output: whole (LangGraph's serializer,
    base64), plus its content and status for people reading the ledger."""
    kind, data = _SERDE.dumps_typed(output)
    shown: dict[str, Any] = {"type": kind, "data": base64.b64encode(data).decode()}
    if isinstance(output, ToolMessage):
        shown["content"] = output.content
        shown["status"] = output.status
    else:
        shown["command"] = True
    return shown


def restored(value: Any, call: GraphToolCall) -> ToolMessage | Command[Any]:
    """The tool output a stored result holds; a result an operator recorded
    when reconciling (any JSON) becomes a ToolMessage with its `content`, or
    with the whole value as JSON text."""
    if isinstance(value, Mapping) and "data" in value:
        data = base64.b64decode(value["data"])
        output = _SERDE.loads_typed((str(value.get("type", "msgpack")), data))
        if isinstance(output, ToolMessage | Command):
            return output
    content = value.get("content") if isinstance(value, Mapping) else value
    if not isinstance(content, str | list):
        content = json.dumps(value)
    return ToolMessage(content=content, name=call.tool, tool_call_id=call.call_id)


class ToolErrorMessage(Exception):
    """A ToolNode's error `ToolMessage`, carried to the safe call as an error
    result: committed (the tool ran), replayed as the same message."""

    error_code = TOOL_ERROR

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(str(message.content)[:1000])
        self.message = message
        self.error_result = stored(message)


def request(kind: str, call: GraphToolCall, record: ToolCall) -> dict[str, Any]:
    """The value of an interrupt for a human: what waits, and the exact call
    (arguments, fingerprint and revision) an answer is about."""
    return {
        KIND: kind,
        "run_id": call.run_id,
        "call_id": call.call_id,
        "tool": call.tool,
        "arguments": call.arguments,
        "effect": Effect(record.effect).name,
        "state": record.state.name,
        "input_fingerprint": record.input_fingerprint,
        "revision": record.revision,
        "message": _MESSAGES[kind],
    }


_MESSAGES = {
    "approval": "the call waits for an approver: resume with approve(...) or "
    "reject(...) of this request (a list of answers for several of `calls`), or "
    "after an approver decided it in effectd",
    "reconcile": "a side effect of unknown outcome: an operator reconciles it in "
    "effectd (effectd ctl reconcile RUN CALL --result JSON, or --not-executed); "
    "then resume the graph (with any value)",
    "retry": "the last attempt's outcome is unknown: resume with retry(...) to "
    "run this READ or IDEMPOTENT_WRITE tool again, after checking it is safe",
    "in_progress": "another attempt holds the call (a live process, or a crashed "
    "one whose lease has not run out): resume the graph to wait again",
}


def approve(
    interrupt_value: Mapping[str, Any], *, approver: str, reason: str = ""
) -> dict[str, Any]:
    """The resume value that approves the call an approval interrupt shows,
    bound to its arguments (fingerprint) and revision."""
    return _answer(interrupt_value, True, approver, reason)


def reject(
    interrupt_value: Mapping[str, Any], *, approver: str, reason: str = ""
) -> dict[str, Any]:
    """The resume value that rejects the call an approval interrupt shows:
    the tool never runs, the model gets an error result."""
    return _answer(interrupt_value, False, approver, reason)


def retry(interrupt_value: Mapping[str, Any]) -> dict[str, Any]:
    """The resume value that runs a READ or IDEMPOTENT_WRITE tool of unknown
    outcome again (a SIDE_EFFECT is never run again: it is reconciled)."""
    if interrupt_value.get(KIND) != "retry":
        raise ApprovalMismatch("retry() answers a retry interrupt")
    return {**_bound(interrupt_value), "retry": True}


def _bound(value: Mapping[str, Any]) -> dict[str, Any]:
    """What binds an answer to its call: the call, its fingerprint, and the
    arguments the person was shown (checked against what effectd recorded)."""
    bound = {k: value[k] for k in ("run_id", "call_id", "input_fingerprint")}
    return {**bound, "arguments": value.get("arguments")}


def _answer(
    value: Mapping[str, Any], approve: bool, approver: str, reason: str
) -> dict[str, Any]:
    if value.get(KIND) != "approval":
        raise ApprovalMismatch("approve() and reject() answer an approval interrupt")
    if not approver:
        raise ValueError("approver: who decides, for the audit log")
    return {
        **_bound(value),
        "revision": value["revision"],
        "approve": approve,
        "approver": approver,
        "reason": reason,
    }


def recorded_arguments(call: GraphToolCall, record: ToolCall) -> Any:
    """The arguments effectd recorded for the call: its kept input, else the
    model's arguments the call was prepared with (its fingerprint's)."""
    if record.kept_input_json is not None:
        return json.loads(record.kept_input_json)
    return call.arguments


def call_options(
    call: GraphToolCall, retry_unknown: bool, timeout: float | None
) -> dict[str, Any]:
    """The safe call's options for a graph's tool call."""
    return {
        "call_id": call.call_id,
        "effect": call.decision.effect,
        "require_approval": call.decision.require_approval,
        "retry_unknown": retry_unknown or call.decision.retry_unknown is True,
        "timeout": timeout,
        # A tool that interrupts itself may have acted before it asked.
        "unknown_on": (GraphBubbleUp,),
        "serialize": stored,
    }


def decision(answer: Any) -> dict[str, Any]:
    return {
        "approve": answer["approve"] is True,
        "approver": str(answer.get("approver") or "langgraph"),
        # The daemon keeps a reason with every decision.
        "reason": str(answer.get("reason") or "answered a LangGraph interrupt"),
        "expected_revision": int(answer["revision"]),
        "input_fingerprint": str(answer["input_fingerprint"]),
    }


def stored_error(call: GraphToolCall, failed: ToolFailed) -> ToolMessage | Command[Any]:
    """A stored error result: the error ToolMessage it was, else re-raised."""
    if failed.error_code == TOOL_ERROR and failed.result.value is not None:
        return restored(failed.result.value, call)
    raise failed


def rejected_message(call: GraphToolCall, rejected: CallRejected) -> ToolMessage:
    # The daemon's message names the approver and their reason.
    reason = rejected.result.error_message or "an approver rejected the call"
    return ToolMessage(
        content=f"the tool was not run: {reason}",
        name=call.tool,
        tool_call_id=call.call_id,
        status="error",
    )
