"""Google ADK tool calls through the ledger: `LedgeredTool`.

Install with `pip install effectd-client[google-adk]`; `import
effectd_client` alone never imports ADK. `LedgeredTool` wraps an ADK tool
(a `FunctionTool`, or a plain function, which ADK would wrap in one) and
runs each of its calls through the safe call (`AsyncRun.call`), keyed by the
run (the ADK session's id, unless `run_id` says otherwise) and the model's
function call id (`ToolContext.function_call_id`, kept in the session's
events), with the effect the operator's `ToolPolicy` gives the tool
(SIDE_EFFECT when it says nothing):

  committed before (same call id)     -> its stored result; the tool does
    (an invocation resumed, a session    not run
    rewound and run again)
  the tool returns                    -> committed, then handed to the model
  the tool raises                     -> committed ERROR (re-raised), or
                                         UNKNOWN when it cannot know whether
                                         it acted: then a reconcile pause
  a SIDE_EFFECT of unknown outcome    -> a reconcile pause: never run again;
    (the process died mid-call)          an operator reconciles it in effectd
                                         and the resumed invocation gets the
                                         result found (or runs the call once,
                                         if it verifiably never ran)
  the policy requires approval        -> an approval pause until an approver
                                         decides in effectd (`decide`, `effectd
                                         ctl approve`, the console)
  rejected by an approver             -> an error result for the model
  another attempt holds a live lease  -> waits for it, at most
                                         `in_progress_wait` seconds, then a pause

A pause is ADK's own tool confirmation (`ToolContext.request_confirmation`):
the invocation stops with an `adk_request_confirmation` function call for
each call waiting for a human, all the calls of the model's response at
once, its `toolConfirmation.payload` carrying the ledger's facts under
`"effectd"` (`PAUSE_KEY`); `paused_calls(session.events)` lists them.
Answering a confirmation resumes the invocation, and the call looks at the
ledger again: ADK's "confirmed" authorizes nothing (only a decision recorded
in effectd does), and an answer whose payload shows other `arguments` than
the call has is refused. A call that still waits after its answer raises
`StillWaiting` out of `run_async` and its pause stays open (ADK would not
surface a second confirmation of an answered call); answer it again later.
Run the agent in an `App` with `ResumabilityConfig(is_resumable=True)`, so
that a pause stops the invocation (without it ADK hands the pause's
placeholder to the model) and an invocation cut off by a crash resumes
(`run_async(invocation_id=...)`) with the calls it left unanswered.

    tools = [LedgeredTool(book, client=effectd, policy=POLICY)]
    agent = LlmAgent(name="travel", model=model, tools=tools)
    app = App(name="travel", root_agent=agent,
              resumability_config=ResumabilityConfig(is_resumable=True))
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from effectd_client import (
    ApprovalPending,
    AsyncClient,
    AsyncRun,
    CallInProgress,
    CallRejected,
    Effect,
    ReconciliationNeeded,
    RetryRequired,
    State,
    ToolCall,
    ToolFailed,
    ToolTimedOut,
)
from effectd_client.contrib.google_adk._pauses import (
    CONFIRMATION_CALL,
    PAUSE_KEY,
    ApprovalMismatch,
    StillWaiting,
    decide,
    json_text,
    pause_facts,
    paused_calls,
)
from effectd_client.extend import is_unknown
from effectd_client.policy import PolicyError, ToolDecision, ToolPolicy, ToolRule

__all__ = [
    "CONFIRMATION_CALL",
    "PAUSE_KEY",
    "ApprovalMismatch",
    "LedgeredTool",
    "PolicyError",
    "StillWaiting",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "decide",
    "paused_calls",
]

# What the model would read if a pause did not stop the invocation.
PAUSED = "paused: waiting for a human in effectd (nothing ran)"
# The pause between looks at a call another attempt holds.
IN_PROGRESS_POLL = 0.2
HINTS = {
    "approve": "approve or reject this call in effectd, then answer",
    "reconcile": "the outcome is unknown: reconcile it in effectd, then answer",
    "wait": "another attempt holds the call: answer to look again",
}


class LedgeredTool(BaseTool):  # type: ignore[misc]  # ADK's types live in .venv-adk
    """An ADK tool whose calls go through the ledger (see the module docs).

    Args:
        tool: The ADK tool, or a function (wrapped in a `FunctionTool`).
        client: The effectd client.
        policy: The operator's `ToolPolicy`, or its rules by tool name (a
            `ToolRule` or an `Effect`); a tool not named is a SIDE_EFFECT
            without approval. A rule's `retry_unknown=True` runs a READ or
            IDEMPOTENT_WRITE of unknown outcome again; by default a pause
            asks a human. A tool that asks ADK for confirmation
            (`require_confirmation`) requires an effectd approval too.
        run_id: The ledger's run: a string, or a function of the
            `ToolContext`; None: the ADK session's id.
        lease_ms: The lease of a started call (0: the daemon's default); a
            crashed call's outcome turns unknown when it runs out.
        timeout: Seconds a call may run; past it the outcome is unknown.
        in_progress_wait: Seconds to wait for another attempt's lease (a
            crashed process's) before pausing.
    """

    def __init__(
        self,
        tool: BaseTool | Callable[..., Any],
        *,
        client: AsyncClient,
        policy: ToolPolicy | Mapping[str, ToolRule | Effect] | None = None,
        run_id: str | Callable[[ToolContext], str] | None = None,
        lease_ms: int = 0,
        timeout: float | None = None,
        in_progress_wait: float = 30.0,
    ) -> None:
        inner = tool if isinstance(tool, BaseTool) else FunctionTool(tool)
        super().__init__(
            name=inner.name,
            description=inner.description,
            is_long_running=inner.is_long_running,
            custom_metadata=inner.custom_metadata,
        )
        self.tool = inner
        self.client = client
        self.policy = ToolPolicy.of(policy)
        self.run_id = run_id
        self.lease_ms, self.timeout = lease_ms, timeout
        self.in_progress_wait = in_progress_wait

    def _get_declaration(self) -> types.FunctionDeclaration | None:
        return self.tool._get_declaration()

    async def decide(self, args: dict[str, Any], ctx: ToolContext) -> ToolDecision:
        """The effect, approval and retry a call is prepared with."""
        decided = self.policy.decide(self.name)
        approval = decided.require_approval or bool(
            await self.tool.check_require_confirmation(args, ctx)
        )
        return ToolDecision(decided.effect, approval, bool(decided.retry_unknown))

    def ledger_run(self, ctx: ToolContext) -> AsyncRun:
        """The ledger's run of a call (see `run_id`)."""
        if isinstance(self.run_id, str):
            run_id = self.run_id
        elif self.run_id is not None:
            run_id = self.run_id(ctx)
        else:
            run_id = ctx.session.id
        return AsyncRun(self.client, run_id, lease_ms=self.lease_ms)

    async def run_async(
        self, *, args: dict[str, Any], tool_context: ToolContext
    ) -> Any:
        """Runs the tool at most once for its call (see the module docs)."""
        call_id = tool_context.function_call_id
        if not call_id:
            raise ValueError(f"{self.name}: a call without a function call id")
        run = self.ledger_run(tool_context)
        decided = await self.decide(args, tool_context)
        refused = _refusal(tool_context.tool_confirmation, args)
        if refused:
            # Nothing runs on an answer about other arguments.
            record = await self.client.get_tool_call(run.run_id, call_id)
            return self._pause(tool_context, record, _action(record), refused)
        waiting_until = time.monotonic() + self.in_progress_wait
        while True:
            try:
                return await self._once(run, call_id, args, tool_context, decided)
            except CallInProgress as busy:
                if time.monotonic() < waiting_until:
                    await asyncio.sleep(IN_PROGRESS_POLL)
                    continue
                return self._pause(tool_context, busy.call, "wait")
            except (
                ApprovalPending,
                ReconciliationNeeded,
                RetryRequired,
                _Unknown,
                CallRejected,
                ToolFailed,
            ) as stopped:
                return self._stopped(stopped, tool_context)

    def _stopped(self, stopped: Exception, ctx: ToolContext) -> dict[str, Any]:
        """What a call the ledger stopped gives ADK: a pause, or an error
        result for the model (rejected, a stored error)."""
        if isinstance(stopped, ApprovalPending):
            answer = ctx.tool_confirmation
            if answer is not None and not answer.confirmed:
                # Declined in ADK: nothing is recorded, nothing runs.
                return {"error": "the call was not approved; it did not run"}
            return self._pause(ctx, stopped.call, "approve")
        if isinstance(stopped, (ReconciliationNeeded, RetryRequired, _Unknown)):
            return self._pause(ctx, stopped.call, "reconcile")
        if isinstance(stopped, CallRejected):
            message = stopped.result.error_message
            return {"error": f"an approver rejected the call: {message}"}
        assert isinstance(stopped, ToolFailed)
        result = stopped.result
        return {"error": result.error_message or result.error_code}

    async def _once(
        self,
        run: AsyncRun,
        call_id: str,
        args: dict[str, Any],
        ctx: ToolContext,
        decided: ToolDecision,
    ) -> Any:
        ran = False
        try:
            async with run.call(
                self.name,
                args,
                call_id=call_id,
                effect=decided.effect,
                retry_unknown=bool(decided.retry_unknown),
                require_approval=decided.require_approval,
                timeout=self.timeout,
                serialize=_serialize,
            ) as step:
                if not step.execute:
                    return step.result
                ran = True
                if decided.require_approval and ctx.tool_confirmation is None:
                    # Approved in effectd: the tool's own ADK confirmation
                    # must not ask again (and answer the model a placeholder).
                    ctx.tool_confirmation = ToolConfirmation(confirmed=True)
                value = await self.tool.run_async(args=args, tool_context=ctx)
                step.set_result(value)
                return value
        except Exception as exc:
            if ran and (isinstance(exc, ToolTimedOut) or is_unknown(exc)):
                call = await run.client.get_tool_call(run.run_id, call_id)
                raise _Unknown(call) from exc
            raise

    def _pause(
        self, ctx: ToolContext, call: ToolCall, action: str, refused: str = ""
    ) -> dict[str, Any]:
        facts = pause_facts(call, action)
        if refused:
            facts["refused"] = refused
        if ctx.tool_confirmation is not None:
            # An answered pause that still waits: ADK would record a second
            # request without surfacing it and end the invocation; raised,
            # the invocation stops with the answered request still open.
            raise StillWaiting(facts)
        ctx.request_confirmation(
            hint=f"{HINTS[action]} ({facts['show']})", payload={PAUSE_KEY: facts}
        )
        ctx.actions.skip_summarization = True
        return {"error": PAUSED}


class _Unknown(Exception):
    def __init__(self, call: ToolCall) -> None:
        super().__init__(call.call_id)
        self.call = call


def _action(call: ToolCall) -> str:
    return "approve" if call.state is State.AWAITING_APPROVAL else "reconcile"


def _refusal(answer: ToolConfirmation | None, args: Mapping[str, Any]) -> str:
    """Why an answer is refused: it shows other arguments than the call's."""
    payload = answer.payload if answer is not None else None
    if not isinstance(payload, Mapping) or "arguments" not in payload:
        return ""
    if json_text(payload["arguments"]) == json_text(args):
        return ""
    return (
        f"the answer shows other arguments ({payload['arguments']!r}) than the "
        "call has: an approval holds only for the arguments it was given for"
    )


def _serialize(value: Any) -> Any:
    """A tool's return value as the JSON the ledger stores and replays."""
    return json.loads(json.dumps(value, default=str))
