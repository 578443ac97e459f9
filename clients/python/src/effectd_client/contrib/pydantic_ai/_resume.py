"""What `effectd_client.contrib.pydantic_ai` tells of a deferral, and how a run it
deferred is resumed: the calls of its last model response that have no
result in the history yet.

A run ends with `DeferredToolRequests` once its step's calls have run or
been deferred, and its history keeps the results of those that ran. A run
resumed from that history alone never calls the toolset for a deferred
call: Pydantic AI answers it "The tool call was interrupted before a result
was produced." and goes on, so a result an operator found, or a call still
running, never reaches the model (which then asks again, a duplicate). So
a resume must carry every open call (`open_calls`): `EffectdToolset.
resume_results` gives each call effectd knows back to the toolset as a
`ToolApproved` marked as a resume (`RESUME`), which is not an approval;
and the toolset refuses a model request whose history leaves a call of
its own unanswered (`DeferredCallsNotResumed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    SYNTHESIZED_TOOL_RETURN_METADATA_KEY,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.tools import DeferredToolRequests

from effectd_client import AsyncClient, ToolCall

# Where a deferral's ledger facts travel (`DeferredToolRequests.metadata`),
# and the mark of a resume in `DeferredToolResults.metadata`.
METADATA_KEY = "effectd"
RESUME = {METADATA_KEY: {"resume": True}}


class DeferredCallsNotResumed(UserError):
    """The run was resumed from a history that leaves calls effectd knows
    without a result: Pydantic AI would answer them "interrupted" for the
    model. Resume with `deferred_tool_results=await
    toolset.resume_results(history)`. `calls` are the ledger's records."""

    def __init__(self, calls: Sequence[ToolCall]) -> None:
        self.calls = tuple(calls)
        named = ", ".join(
            f"{c.call_id} ({c.tool_name}, {c.state.name}, run {c.run_id})"
            for c in self.calls
        )
        super().__init__(
            f"the history leaves calls of effectd without a result: {named}; "
            "resume with deferred_tool_results=await toolset.resume_results("
            "history) so that each reaches the toolset (docs/pydantic-ai.md)"
        )


def effectd_metadata(call: ToolCall, action: str) -> dict[str, Any]:
    """The facts a deferral carries under `METADATA_KEY`: the ledger's call,
    its state, what a human must do (`approve`, `reconcile`, `wait`), and
    the `effectd ctl` command that shows it (by its run id)."""
    return {
        METADATA_KEY: {
            "run_id": call.run_id,
            "call_id": call.call_id,
            "tool": call.tool_name,
            "state": call.state.name,
            "effect": call.effect.name,
            "revision": call.revision,
            "input_fingerprint": call.input_fingerprint,
            "action": action,
            "show": f"effectd ctl show {call.run_id} {call.call_id}",
        }
    }


def run_of(ctx: RunContext[Any]) -> str:
    """The run in which the model made this call: its response's run id (kept
    in the history across resumes); this run's for a call not in the history.

    Raises:
        ValueError: The response has no run id (a history written without
            them): falling back to this run's id would run the call again on
            every resume, so the caller must name the run (`run_id=`).
    """
    for message in reversed(ctx.messages):
        if not isinstance(message, ModelResponse):
            continue
        for part in message.parts:
            if isinstance(part, ToolCallPart) and part.tool_call_id == ctx.tool_call_id:
                if not message.run_id:
                    raise ValueError(
                        f"{ctx.tool_call_id}: the model response that made the call "
                        "has no run_id; pass run_id= to EffectdToolset"
                    )
                return message.run_id
    if not ctx.run_id:
        raise ValueError("the run has no run_id; pass run_id= to EffectdToolset")
    return ctx.run_id


async def decide_deferred(
    client: AsyncClient,
    requests: DeferredToolRequests,
    tool_call_id: str,
    *,
    approve: bool,
    approver: str,
    reason: str,
) -> ToolCall:
    """Records an approver's decision on a deferred call in the ledger, for
    the arguments and revision the deferral carried (`approver` role when
    the daemon requires tokens).

    Raises:
        KeyError: The call was not deferred by `EffectdToolset`.
        InputMismatch, RevisionConflict: The call changed since.
    """
    facts = requests.metadata.get(tool_call_id, {}).get(METADATA_KEY)
    if not facts or facts.get("action") != "approve":
        raise KeyError(f"{tool_call_id}: not an approval deferred by effectd")
    return await client.decide_approval(
        facts["run_id"],
        facts["call_id"],
        approve=approve,
        approver=approver,
        reason=reason,
        expected_revision=facts["revision"],
        input_fingerprint=facts["input_fingerprint"],
    )


def is_resume(ctx: RunContext[Any]) -> bool:
    """The call came back through `resume_results`, not an approval."""
    meta = ctx.tool_call_metadata
    facts = meta.get(METADATA_KEY) if isinstance(meta, dict) else None
    return isinstance(facts, dict) and facts.get("resume") is True


def open_calls(
    messages: Sequence[ModelMessage],
) -> tuple[ModelResponse | None, list[ToolCallPart], bool]:
    """The last model response, its calls without a result in the requests
    after it (or with one Pydantic AI made up: "interrupted"), and whether a
    request follows it. A response no request follows (its calls all
    deferred, or a crash in the middle of them) has all its calls open, and
    a run resumed from it alone calls the toolsets for each of them."""
    for index in range(len(messages) - 1, -1, -1):
        response = messages[index]
        if not isinstance(response, ModelResponse):
            continue
        after = [m for m in messages[index + 1 :] if isinstance(m, ModelRequest)]
        answered = {_answered(part) for message in after for part in message.parts}
        calls = [c for c in response.tool_calls if c.tool_call_id not in answered]
        return response, calls, bool(after)
    return None, [], False


def _answered(part: Any) -> str | None:
    """The call a tool's own result answers (not a result Pydantic AI made
    up for a lost call)."""
    if isinstance(part, ToolReturnPart):
        meta = part.metadata if isinstance(part.metadata, dict) else {}
        if not meta.get(SYNTHESIZED_TOOL_RETURN_METADATA_KEY):
            return part.tool_call_id
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:
        return part.tool_call_id
    return None
