"""Pydantic AI tool calls through the ledger: `EffectdToolset`.

Install with `pip install effectd-client[pydantic-ai]` (`pydantic-ai-slim`,
no model provider SDKs); `import effectd_client` alone never imports it. The
wrapper is a Pydantic AI toolset around the agent's own toolsets; each tool
call runs through the safe call (`AsyncRun.call`), keyed by the run in which
the model made the call and the model's `tool_call_id`:

  committed before (same call)       -> its stored result (as JSON); the
                                        tool does not run
  the tool returns                   -> committed OK, the result stored
  the tool raises ModelRetry,        -> committed ERROR (the exception's class
    ToolFailed or another definite      is the code); a repeat raises it again
    error                               to the model as ToolFailed (ModelRetry
                                        as ModelRetry), the tool does not run
  the tool raises a timeout, a lost  -> UNKNOWN, and the call is deferred
    connection (an unknown outcome)     (`CallDeferred`) for a human
  unknown outcome before (a crash    -> deferred (`CallDeferred`, kind
    mid-tool, a lease run out)          'external'): a SIDE_EFFECT is never run
                                        again; an operator reconciles it, then
                                        a resumed run gets the result found, or
                                        runs it if it was verified not done.
                                        READ and IDEMPOTENT_WRITE run again
                                        under the daemon's retry rules
  another attempt holds a live lease -> deferred (resume later)
  approval required, not given       -> `ApprovalRequired`: the run ends with
                                        `DeferredToolRequests.approvals`; the
                                        ledger waits for an approver, bound to
                                        these exact arguments
  approved in Pydantic AI            -> the approval recorded in the ledger
    (`DeferredToolResults`)             (DecideApproval, for the arguments the
                                        call was prepared with), then run once
  approved with other arguments      -> `InputMismatch`: an approval holds only
    (`ToolApproved(override_args)`)     for the arguments it was given for
  rejected by an approver            -> ToolFailed to the model; never run

Every deferral carries `metadata["effectd"]` (run id, call id, state, what a
human must do), so it reaches `DeferredToolRequests.metadata`; give the agent
`output_type=[..., DeferredToolRequests]` to receive them as the run's output
(without it Pydantic AI refuses the run with an error: still never re-run).

The run a call belongs to is the toolset's `run_id` (name it: `effectd ctl
list --run` finds it), else the `run_id` of the model response that made it
(Pydantic AI keeps it in the message history), so a run resumed from its
history after a crash, or from `DeferredToolResults`, finds its calls: resume
from the persisted `all_messages()`, not from the prompt (a new model response
has new call ids), with `deferred_tool_results=await toolset.resume_results(
history, approvals)`, which carries every call the run deferred back to the
toolset; a resume that leaves one out is refused (`DeferredCallsNotResumed`):
Pydantic AI would tell the model it was interrupted.

Each tool's effect, approval and retry come from the operator's
`ToolPolicy` (`effectd_client.policy`, the words LangGraph's adapter reads
too; or just its rules by tool name: a `ToolRule` or an `Effect`), default
SIDE_EFFECT; a tool declared `requires_approval=True` requires an effectd
approval too. An IDEMPOTENT_WRITE tool reads its key `{run_id}:{call_id}`
from `effectd_client.current_call()`.

    toolset = EffectdToolset(
        FunctionToolset([send_email, lookup]),
        client=effectd,  # an AsyncClient
        policy={"lookup": Effect.READ},
    )
    agent = Agent(model, toolsets=[toolset],
                  output_type=[str, DeferredToolRequests])

Approvals given outside Pydantic AI (`effectd ctl approve`, the console, or
`decide_deferred` with an approver's token) count too: a resumed run then
executes the approved call without `DeferredToolResults`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry
from pydantic_ai.exceptions import ToolFailed as PydanticToolFailed
from pydantic_ai.messages import ModelMessage, ToolCallPart
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolResults,
    ToolApproved,
)
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from effectd_client import (
    ApprovalPending,
    AsyncClient,
    AsyncRun,
    CallInProgress,
    CallRejected,
    Effect,
    NotFound,
    ReconciliationNeeded,
    RetryRequired,
    RevisionConflict,
    ToolCall,
    ToolFailed,
    ToolTimedOut,
)
from effectd_client.contrib.pydantic_ai._resume import (
    METADATA_KEY,
    RESUME,
    DeferredCallsNotResumed,
    decide_deferred,
    effectd_metadata,
    is_resume,
    open_calls,
    run_of,
)
from effectd_client.extend import is_unknown
from effectd_client.policy import PolicyError, ToolDecision, ToolPolicy, ToolRule

__all__ = [
    "METADATA_KEY",
    "DeferredCallsNotResumed",
    "EffectdToolset",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "decide_deferred",
    "effectd_metadata",
]

# Who the ledger names as the approver of a call approved through Pydantic AI.
DEFAULT_APPROVER = "pydantic-ai"
# The code of a committed error raised as ModelRetry (replayed as such).
MODEL_RETRY = "ModelRetry"
# Rounds of prepare, record a Pydantic AI approval, prepare again.
MAX_APPROVAL_ROUNDS = 3


@dataclass
class EffectdToolset(WrapperToolset[AgentDepsT]):
    """A toolset whose calls go through the ledger (see the module docs).

    Args:
        wrapped: The agent's toolset (e.g. a `FunctionToolset`).
        client: The effectd client.
        policy: The operator's `ToolPolicy`, or its rules by tool name (a
            `ToolRule` or just an `Effect`); a tool not named is a
            SIDE_EFFECT without approval. A rule's `retry_unknown` None runs
            a READ or IDEMPOTENT_WRITE of unknown outcome again.
        run_id: The ledger's run id: a string, or a function of the
            `RunContext`; None: the run in which the model made the call.
        lease_ms: The lease of a started call (0: the daemon's default); a
            crashed call's outcome turns unknown when it runs out.
        timeout: Seconds a call may run; past it the outcome is unknown.
        approver: The name a Pydantic AI approval is recorded under in the
            ledger; None: only an approver's own decision in effectd counts,
            and a Pydantic AI approval alone defers the call again.
    """

    client: AsyncClient = field(kw_only=True)
    policy: ToolPolicy | Mapping[str, ToolRule | Effect] = field(
        default_factory=ToolPolicy, kw_only=True
    )
    run_id: str | Callable[[RunContext[Any]], str] | None = field(
        default=None, kw_only=True
    )
    lease_ms: int = field(default=0, kw_only=True)
    timeout: float | None = field(default=None, kw_only=True)
    approver: str | None = field(default=DEFAULT_APPROVER, kw_only=True)

    def decide(
        self, name: str, tool: ToolsetTool[AgentDepsT] | None = None
    ) -> ToolDecision:
        """The effect, approval and retry a call of `name` is prepared with."""
        decided = ToolPolicy.of(self.policy).decide(name)
        if decided.retry_unknown is None:
            retry = decided.effect is not Effect.SIDE_EFFECT
            decided = replace(decided, retry_unknown=retry)
        meta = (tool.tool_def.metadata or {}) if tool is not None else {}
        if meta.get(METADATA_KEY, {}).get("require_approval"):
            decided = replace(decided, require_approval=True)
        return decided

    async def get_tools(
        self, ctx: RunContext[AgentDepsT]
    ) -> dict[str, ToolsetTool[AgentDepsT]]:
        """The wrapped tools; one declared `requires_approval` is called like
        the others and deferred by the ledger, which binds the approval to
        the call's arguments (Pydantic AI would defer it unrecorded)."""
        tools = await super().get_tools(ctx)
        for name, tool in tools.items():
            if tool.tool_def.kind == "unapproved":
                meta = {**(tool.tool_def.metadata or {})}
                meta[METADATA_KEY] = {"require_approval": True}
                tool_def = replace(tool.tool_def, kind="function", metadata=meta)
                tools[name] = replace(tool, tool_def=tool_def)
        return tools

    def _run(self, ctx: RunContext[AgentDepsT]) -> AsyncRun:
        if isinstance(self.run_id, str):
            run_id = self.run_id
        elif self.run_id is not None:
            run_id = self.run_id(ctx)
        else:
            run_id = run_of(ctx)
        return AsyncRun(self.client, run_id, lease_ms=self.lease_ms)

    async def _known(
        self, run_id: str, calls: Sequence[ToolCallPart]
    ) -> list[ToolCall]:
        """The ledger's records of those of `calls` it has."""
        known = []
        for call in calls:
            with suppress(NotFound):
                known.append(await self.client.get_tool_call(run_id, call.tool_call_id))
        return known

    async def resume_results(
        self,
        messages: Sequence[ModelMessage],
        results: DeferredToolResults | None = None,
        *,
        run_id: str | None = None,
    ) -> DeferredToolResults | None:
        """The `deferred_tool_results` of a run resumed from `messages` (the
        persisted `all_messages()`): `results` (the approvals a human gave in
        Pydantic AI), and every other call of the last model response that
        the history leaves without a result and effectd knows, back through
        this toolset (a resume, not an approval: the ledger answers it, with
        its stored or reconciled result, a run if it was verified not done,
        or a deferral again). None: nothing to carry; resume from the
        history alone.

        Args:
            run_id: The ledger's run, when this toolset's `run_id` is a
                function; default the toolset's, else the response's.
        """
        response, unanswered, followed = open_calls(messages)
        given = results or DeferredToolResults()
        carried = [
            c
            for c in unanswered
            if c.tool_call_id not in given.approvals
            and c.tool_call_id not in given.calls
        ]
        # No request after the response, and no results: resumed from the
        # history alone, the run calls the toolset for each of its calls.
        if response is None or not carried or (results is None and not followed):
            return results
        if run_id is None and callable(self.run_id):
            raise ValueError("this toolset's run_id is a function: pass run_id=")
        run = run_id or self.run_id or response.run_id
        if not isinstance(run, str) or not run:
            raise ValueError("the model response has no run_id: pass run_id=")
        out = DeferredToolResults(
            approvals=dict(given.approvals),
            calls=dict(given.calls),
            metadata=dict(given.metadata),
        )
        for call in await self._known(run, carried):
            out.approvals[call.call_id] = ToolApproved()
            out.metadata[call.call_id] = {
                **out.metadata.get(call.call_id, {}),
                **RESUME,
            }
        return out

    async def get_instructions(self, ctx: RunContext[AgentDepsT]) -> Any:
        """The wrapped toolset's instructions, once the model's request does
        not leave a call effectd knows without a result (Pydantic AI would
        answer it "interrupted").

        Raises:
            DeferredCallsNotResumed: The run was resumed from a history
                without its deferred calls (`resume_results`).
        """
        response, unanswered, followed = open_calls(ctx.messages)
        if response is not None and unanswered and followed:
            first = replace(ctx, tool_call_id=unanswered[0].tool_call_id)
            known = await self._known(self._run(first).run_id, unanswered)
            if known:
                raise DeferredCallsNotResumed(known)
        return await super().get_instructions(ctx)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """Runs the tool at most once for its call (see the module docs)."""
        if not ctx.tool_call_id:
            raise ValueError(f"{name}: a call without tool_call_id")
        run, rule = self._run(ctx), self.decide(name, tool)
        # A Pydantic AI approval is recorded, then the call prepared again; a
        # lost race for the revision (another process recorded it) once more.
        waiting: ToolCall | None = None
        for _ in range(MAX_APPROVAL_ROUNDS):
            try:
                return await self._call(
                    run, rule, name=name, tool_args=tool_args, ctx=ctx, tool=tool
                )
            except ApprovalPending as pending:
                waiting = pending.call
            approved = ctx.tool_call_approved and not is_resume(ctx)
            if not (approved and self.approver):
                break
            with suppress(RevisionConflict):
                await self._approve(waiting)
        assert waiting is not None
        raise ApprovalRequired(effectd_metadata(waiting, "approve"))

    async def _call(
        self,
        run: AsyncRun,
        rule: ToolDecision,
        *,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        call_id = ctx.tool_call_id
        assert call_id is not None
        ran = False
        try:
            async with run.call(
                name,
                to_jsonable_python(tool_args),
                call_id=call_id,
                effect=rule.effect,
                retry_unknown=bool(rule.retry_unknown),
                require_approval=rule.require_approval,
                timeout=self.timeout,
                serialize=_serialize,
            ) as step:
                if not step.execute:
                    return step.result
                ran = True
                value = await self.wrapped.call_tool(name, tool_args, ctx, tool)
                step.set_result(value)
                return value
        except (ReconciliationNeeded, RetryRequired) as stopped:
            raise CallDeferred(effectd_metadata(stopped.call, "reconcile")) from None
        except CallInProgress as busy:
            raise CallDeferred(effectd_metadata(busy.call, "wait")) from None
        except CallRejected as rejected:
            raise PydanticToolFailed(
                f"an approver rejected the call: {rejected.result.error_message}"
            ) from None
        except ToolFailed as failed:
            code, message = failed.result.error_code, failed.result.error_message
            if code == MODEL_RETRY:
                raise ModelRetry(message) from None
            raise PydanticToolFailed(message or code) from None
        except Exception as exc:
            # The safe call recorded it UNKNOWN: a human decides, not the model.
            if ran and (isinstance(exc, ToolTimedOut) or is_unknown(exc)):
                call = await run.client.get_tool_call(run.run_id, call_id)
                raise CallDeferred(effectd_metadata(call, "reconcile")) from exc
            raise

    async def _approve(self, call: ToolCall) -> None:
        assert self.approver is not None
        await self.client.decide_approval(
            call.run_id,
            call.call_id,
            approve=True,
            approver=self.approver,
            reason="approved through Pydantic AI (DeferredToolResults)",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )


def _serialize(value: Any) -> Any:
    """A tool's return value as the JSON the ledger stores and replays."""
    return to_jsonable_python(value, fallback=str)
