"""Microsoft Agent Framework tool calls through the ledger: `EffectdMiddleware`.

Install with `pip install effectd-client[agent-framework]` (the framework's
core package, no model provider SDKs); `import effectd_client` alone never
imports it. The middleware is a function middleware of the framework's
function-invocation loop: give it to the agent (`Agent(...,
middleware=[EffectdMiddleware(client=effectd)])`) and every function tool
call runs through the safe call (`AsyncRun.call`), keyed by the run (the
session's id, or `run_id=`) and the model's `call_id`:

  committed before (same call)       -> its stored result; the tool does not
                                        run
  the tool returns                   -> committed OK, the result stored (the
                                        text of a text result, else the
                                        contents' JSON)
  the tool raises a definite error   -> committed ERROR; the model gets the
                                        framework's error result; a repeat
                                        raises it again, the tool does not run
  the tool raises a timeout, a lost  -> UNKNOWN, and the run pauses on the
    connection (an unknown outcome)     call for reconciliation
  unknown outcome before (a crash    -> paused for reconciliation: a
    mid-tool, a lease run out)          SIDE_EFFECT is never run again; an
                                        operator reconciles it, then a resumed
                                        run gets the result found, or runs it
                                        if it was verified not done. READ and
                                        IDEMPOTENT_WRITE run again under the
                                        daemon's retry rules
  another attempt holds a live lease -> paused (`wait`): resume later
  approval required, not given       -> paused (`approve`): the ledger waits
                                        for an approver, bound to these exact
                                        arguments
  approved in the framework only     -> nothing runs: paused again (with an
                                        `approver` name, the framework's
                                        approval is recorded in the ledger
                                        under it, for the arguments shown)
  approved with edited arguments     -> never run: the framework binds an
                                        answer to the request it answers and
                                        runs the arguments shown; a call that
                                        reaches the ledger with other
                                        arguments than it holds is refused
                                        (`mismatch`), paused on every answer
  rejected by an approver            -> an error result to the model; never
                                        run

A pause is the framework's own: a `function_approval_request` in the run's
`user_input_requests`, with the ledger's facts in its
`additional_properties["effectd"]` (`facts_of`; `action` is `approve`,
`reconcile`, `wait` or `mismatch`); every call of the model's
turn that cannot go on pauses in the same response, so one answer names
all the unsettled siblings. Answer each with
`request.to_function_approval_response(approved=True)` on the same
session: it brings the call back to the middleware, which asks the ledger
again (what an operator reconciled or an approver decided in effectd
counts; the framework's answer alone does not).

Each tool's effect, approval and retry come from the operator's
`ToolPolicy` (`effectd_client.policy`; or its rules by tool name: a
`ToolRule` or an `Effect`), default SIDE_EFFECT; a tool declared
`approval_mode="always_require"` requires an effectd approval too. An
IDEMPOTENT_WRITE tool reads its key `{run_id}:{call_id}` from
`effectd_client.current_call()`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import replace

from agent_framework import (
    Content,
    FunctionInvocationContext,
    FunctionMiddleware,
    MiddlewareFailure,
)
from agent_framework.exceptions import ToolExecutionException

from effectd_client import (
    ApprovalPending,
    AsyncClient,
    AsyncRun,
    CallInProgress,
    CallRejected,
    Effect,
    InputMismatch,
    ReconciliationNeeded,
    RetryRequired,
    RevisionConflict,
    ToolCall,
    ToolFailed,
    ToolTimedOut,
)
from effectd_client.contrib.agent_framework._pause import (
    METADATA_KEY,
    arguments_of,
    decide_request,
    facts_of,
    pause,
    restored,
    stored,
)
from effectd_client.extend import is_unknown
from effectd_client.policy import PolicyError, ToolDecision, ToolPolicy, ToolRule

__all__ = [
    "METADATA_KEY",
    "EffectdMiddleware",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "decide_request",
    "facts_of",
    "is_pause",
]

# Rounds of prepare, record a framework approval, prepare again.
MAX_APPROVAL_ROUNDS = 3


class EffectdMiddleware(FunctionMiddleware):
    """A function middleware whose tool calls go through the ledger (see the
    module docs).

    Args:
        client: The effectd client.
        policy: The operator's `ToolPolicy`, or its rules by tool name (a
            `ToolRule` or just an `Effect`); a tool not named is a
            SIDE_EFFECT without approval. A rule's `retry_unknown` None runs
            a READ or IDEMPOTENT_WRITE of unknown outcome again.
        run_id: The ledger's run id: a string, or a function of the
            invocation's context; None: the session's id (the run must have
            a session).
        lease_ms: The lease of a started call (0: the daemon's default); a
            crashed call's outcome turns unknown when it runs out.
        timeout: Seconds a call may run; past it the outcome is unknown.
        approver: The name a framework approval is recorded under in the
            ledger; None (the default): only an approver's own decision in
            effectd counts, and a framework approval pauses the call again.
    """

    def __init__(
        self,
        *,
        client: AsyncClient,
        policy: ToolPolicy | Mapping[str, ToolRule | Effect] | None = None,
        run_id: str | Callable[[FunctionInvocationContext], str] | None = None,
        lease_ms: int = 0,
        timeout: float | None = None,
        approver: str | None = None,
    ) -> None:
        self.client = client
        self.policy = ToolPolicy.of(policy if policy is not None else ToolPolicy())
        self.run_id = run_id
        self.lease_ms = lease_ms
        self.timeout = timeout
        self.approver = approver

    def decide(self, context: FunctionInvocationContext) -> ToolDecision:
        """The effect, approval and retry the call is prepared with."""
        decided = self.policy.decide(context.function.name)
        if decided.retry_unknown is None:
            retry = decided.effect is not Effect.SIDE_EFFECT
            decided = replace(decided, retry_unknown=retry)
        if getattr(context.function, "approval_mode", None) == "always_require":
            decided = replace(decided, require_approval=True)
        return decided

    def run_of(self, context: FunctionInvocationContext) -> str:
        """The ledger's run the call belongs to."""
        if isinstance(self.run_id, str):
            return self.run_id
        if self.run_id is not None:
            return self.run_id(context)
        if context.session is None:
            raise MiddlewareFailure(
                "effectd: the run has no session; pass session= to run() "
                "or run_id= to EffectdMiddleware"
            )
        return context.session.session_id

    async def process(
        self,
        context: FunctionInvocationContext,
        call_next: Callable[[], Awaitable[None]],
    ) -> None:
        """Runs the tool at most once for its call (see the module docs)."""
        call_id = context.metadata.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise MiddlewareFailure(f"{context.function.name}: a call without call_id")
        run = AsyncRun(self.client, self.run_of(context), lease_ms=self.lease_ms)
        rule = self.decide(context)
        answered = context.metadata.get("approval_response") is not None
        waiting: ToolCall | None = None
        for _ in range(MAX_APPROVAL_ROUNDS):
            try:
                await self._call(run, rule, call_id, context, call_next)
                return
            except ApprovalPending as pending:
                waiting = pending.call
            except InputMismatch:
                # Not the arguments the ledger holds the call for: refused,
                # whoever approved what; paused again on every answer.
                call = await self.client.get_tool_call(run.run_id, call_id)
                context.result = pause(context, call, "mismatch")
                return
            if not (answered and self.approver):
                break
            with suppress(RevisionConflict):
                await self._approve(waiting)
        assert waiting is not None
        context.result = pause(context, waiting, "approve")

    async def _call(
        self,
        run: AsyncRun,
        rule: ToolDecision,
        call_id: str,
        context: FunctionInvocationContext,
        call_next: Callable[[], Awaitable[None]],
    ) -> None:
        ran = False
        try:
            async with run.call(
                context.function.name,
                arguments_of(context),
                call_id=call_id,
                effect=rule.effect,
                retry_unknown=bool(rule.retry_unknown),
                require_approval=rule.require_approval,
                timeout=self.timeout,
                serialize=stored,
            ) as step:
                if not step.execute:
                    context.result = restored(step.result)
                    return
                ran = True
                await call_next()
                step.set_result(context.result)
        except (ReconciliationNeeded, RetryRequired) as stopped:
            context.result = pause(context, stopped.call, "reconcile")
        except CallInProgress as busy:
            context.result = pause(context, busy.call, "wait")
        except CallRejected as rejected:
            message = rejected.result.error_message
            raise ToolExecutionException(
                f"an approver rejected the call: {message}"
            ) from None
        except ToolFailed as failed:
            code, message = failed.result.error_code, failed.result.error_message
            raise ToolExecutionException(message or code) from None
        except Exception as exc:
            # The safe call recorded it UNKNOWN: a human decides, not the model.
            if ran and (isinstance(exc, ToolTimedOut) or is_unknown(exc)):
                call = await run.client.get_tool_call(run.run_id, call_id)
                context.result = pause(context, call, "reconcile")
                return
            raise

    async def _approve(self, call: ToolCall) -> None:
        assert self.approver is not None
        await self.client.decide_approval(
            call.run_id,
            call.call_id,
            approve=True,
            approver=self.approver,
            reason="approved through Agent Framework (function_approval_response)",
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )


def is_pause(content: Content) -> bool:
    """`content` (a `user_input_requests` item) is a pause of the middleware."""
    return facts_of(content) is not None
