"""OpenAI Agents SDK tools through the ledger: `AgentLedger`.

Install with `pip install effectd-client[openai-agents]` (the `openai-agents`
package); `import effectd_client` alone never imports it. The ledger wraps
an SDK `FunctionTool` (and the tools of an SDK MCP server) so that each call
is prepared, started and committed in effectd, keyed by the run id the
application gives (`ledger.run(run_id)`) and the model's tool call id
(`ToolContext.tool_call_id`):

  committed before (same call id)    -> its stored output; the tool does not
                                        run (a RunState restored after a
                                        crash sees what the first run saw)
  the tool returns                   -> committed OK, then returned
  the tool raises, outcome definite  -> committed ERROR; the model reads the
                                        error text (a repeat reads it again)
  the tool raises, outcome unknown   -> UNKNOWN; `LedgerInterruption` ends
    (a timeout, a lost connection,      the run: a human reconciles the call
    the task cancelled; for MCP any     (`effectd ctl reconcile`); it is
    exception)                          never run again
  unknown outcome before (same id)   -> `LedgerInterruption` (cause
                                        `ReconciliationNeeded`), nothing run
  approval required (the tool's      -> the SDK's own interruption (a
    `needs_approval`, or the            `ToolApprovalItem`): the call waits
    daemon's policy)                    in AWAITING_APPROVAL; `approve` /
                                        `reject` decide it in effectd (and
                                        in the RunState), bound to the call's
                                        exact arguments
  rejected in effectd                -> the SDK's rejection message

The approval lives in the ledger, not only in the RunState: a RunState
serialized before the approval and restored after a crash asks `needs_approval`
again, and effectd answers that this call is approved, so it runs, once. An
approval authorizes one call id with one set of arguments; other arguments
are another call, which waits for its own approval, and the same call id with
other arguments is refused (`INPUT_MISMATCH`). An SDK approval alone
(`RunState.approve`, `always_approve`) authorizes nothing effectd has not
approved: such a call ends the run with `LedgerInterruption` (cause
`ApprovalPending`).

    ledger = AgentLedger(effectd, policy=POLICY)      # an AsyncClient
    agent = Agent(name="mailer", tools=[
        ledger.tool(lookup),                          # the policy: READ
        ledger.tool(send_email),                      # unnamed: SIDE_EFFECT
    ])
    with ledger.run("order-42"):
        result = await Runner.run(agent, "mail Ann")
        for item in result.interruptions:
            await ledger.approve(item, approver="ann")
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from agents import FunctionTool
from agents.mcp import MCPServer, MCPUtil
from agents.run_context import RunContextWrapper
from agents.tool_context import ToolContext

from effectd_client import (
    AsyncClient,
    AsyncRun,
    CallRejected,
    Channel,
    Decision,
    Effect,
    EffectdError,
    OutcomeUnknown,
    ToolCallStopped,
    ToolFailed,
)
from effectd_client.contrib.openai_agents._approvals import (
    DEFAULT_REJECTION_MESSAGE,
    ApprovalMismatch,
    LedgerApprovals,
    NoLedgerRun,
    Rule,
    arguments_of,
)
from effectd_client.contrib.openai_agents._mcp import stored_result, tool_output
from effectd_client.contrib.openai_agents._stops import (
    LedgerInterruption,
    interruption,
)
from effectd_client.extend import Matcher, McpPolicy, is_unknown
from effectd_client.policy import PolicyError, ToolDecision, ToolPolicy, ToolRule

__all__ = [
    "DEFAULT_REJECTION_MESSAGE",
    "AgentLedger",
    "ApprovalMismatch",
    "LedgerInterruption",
    "NoLedgerRun",
    "PolicyError",
    "ToolDecision",
    "ToolPolicy",
    "ToolRule",
    "mcp_tool_name",
]

_ALL: tuple[Matcher, ...] = (Exception,)


def mcp_tool_name(server: str, tool: str) -> str:
    """The name an MCP tool's call is recorded under: `mcp://{server}/{tool}`."""
    return f"mcp://{server}/{tool}"


class AgentLedger(LedgerApprovals):
    """Wraps Agents SDK tools so each call goes through effectd.

    Args:
        client: The `AsyncClient` the calls go through.
        policy: The operator's `ToolPolicy` (`effectd_client.policy`, the one
            the LangGraph and Pydantic AI adapters read), or its rules by tool
            name: each function tool's effect, approval and retry, unless
            `tool()` is told otherwise; None: every tool a SIDE_EFFECT.
        lease_ms: Lease of a started call (0: the daemon's default); a crashed
            call's outcome turns unknown when it runs out.
        heartbeat_interval: Seconds between lease renewals (default a third of
            the lease).
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        policy: ToolPolicy | Mapping[str, ToolRule | Effect] | None = None,
        lease_ms: int = 0,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.client = client
        self.policy = ToolPolicy.of(policy)
        self.lease_ms = lease_ms
        self.heartbeat_interval = heartbeat_interval
        self._current: ContextVar[AsyncRun | None] = ContextVar(
            "effectd_agents_run", default=None
        )
        self._rules: dict[str, Rule] = {}

    # -- the run -----------------------------------------------------------

    @contextmanager
    def run(self, run_id: str) -> Iterator[AsyncRun]:
        """The run whose id keys every ledgered tool call in this block.

        Use the same run id when the run resumes (from a restored RunState, or
        from the start with the same model transcript).
        """
        run = AsyncRun(
            self.client,
            run_id,
            lease_ms=self.lease_ms,
            heartbeat_interval=self.heartbeat_interval,
        )
        token = self._current.set(run)
        try:
            yield run
        finally:
            self._current.reset(token)

    def _run(self, run_id: str | None = None) -> AsyncRun:
        if run_id is not None:
            return AsyncRun(self.client, run_id, lease_ms=self.lease_ms)
        run = self._current.get()
        if run is None:
            raise NoLedgerRun(
                "a ledgered tool call needs a run id: call it inside "
                "`with ledger.run(run_id):`"
            )
        return run

    # -- wrapping ----------------------------------------------------------

    def tool(
        self,
        tool: FunctionTool,
        *,
        effect: Effect | None = None,
        timeout: float | None = None,
        unknown_on: Sequence[Matcher] = (),
        retry_unknown: bool | None = None,
    ) -> FunctionTool:
        """A copy of `tool` whose calls go through the ledger.

        Args:
            tool: The SDK function tool (e.g. from `@function_tool`). Create
                a side-effecting one with `failure_error_function=None`, so an
                exception reaches the ledger (the SDK's default turns it into
                an error text first, which the ledger then stores as the
                tool's output, whatever the exception meant).
            effect: The declared effect; None: the policy's for the tool's
                name (SIDE_EFFECT unless it names one). An IDEMPOTENT_WRITE
                tool reads its key `{run_id}:{call_id}` from
                `effectd_client.current_call().idempotency_key`.
            timeout: Seconds the tool may run; past it the outcome is unknown
                and the run is interrupted. Default: the tool's own
                `timeout_seconds`, which the ledger takes over (the SDK's
                would cancel the call and invite the model to try again).
            unknown_on: More exception classes (or predicates) that leave the
                outcome unknown (timeouts and connection errors always do).
            retry_unknown: Run a READ or IDEMPOTENT_WRITE call again whose
                last attempt's outcome is unknown (never a SIDE_EFFECT); None:
                the policy's rule, else not (the run is interrupted).

        The call needs approval when the policy requires it, else when the
        tool's own `needs_approval` (a bool or its predicate) says so.
        """
        decided = self.policy.decide(tool.name)
        if retry_unknown is None:
            retry_unknown = decided.retry_unknown is True
        rule = Rule(
            ledger_name=tool.name,
            effect=effect if effect is not None else decided.effect,
            needs_approval=decided.require_approval or tool.needs_approval,
            unknown_on=tuple(unknown_on),
            timeout=timeout if timeout is not None else tool.timeout_seconds,
            retry_unknown=retry_unknown,
        )
        return self._wrap(tool, rule)

    async def mcp_tools(
        self,
        server: MCPServer,
        *,
        name: str,
        policy: McpPolicy | None = None,
        # Each tool call's time limit, as `tool`'s: not a wait of this method.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[FunctionTool]:
        """The tools of a connected SDK MCP server, each through the ledger.

        Pass them as the agent's `tools` (instead of `mcp_servers`). The effect
        and approval of each come from the operator's `McpPolicy` for the
        server `name` (annotations only ever make a call more conservative,
        unless the policy trusts the server); the call is recorded as
        `mcp://{name}/{tool}` (channel MCP). Any exception from the call
        (a lost connection, a timeout, an error answer) leaves its outcome
        unknown: it is never sent again.

        Raises:
            ValueError: The server retries failed calls
                (`max_retry_attempts`): a retried `tools/call` is a second
                call of the tool.
        """
        if not name or "/" in name:
            raise ValueError("name: a non-empty server name without '/'")
        if getattr(server, "max_retry_attempts", 0) != 0:
            raise ValueError(
                f"{name}: the MCP server retries failed calls "
                "(max_retry_attempts); create it with max_retry_attempts=0"
            )
        policy = policy or McpPolicy()
        tools = []
        for mcp_tool in await server.list_tools():
            decision = policy.decide(name, mcp_tool.name, mcp_tool.annotations)
            function = MCPUtil.to_function_tool(
                mcp_tool,
                server,
                convert_schemas_to_strict=False,
                failure_error_function=None,
            )
            rule = Rule(
                ledger_name=mcp_tool_name(name, mcp_tool.name),
                effect=decision.effect,
                needs_approval=decision.require_approval,
                channel=Channel.MCP,
                server=name,
                tool=mcp_tool.name,
                unknown_on=_ALL,
                timeout=timeout,
            )
            tools.append(self._wrap(function, rule))
        return tools

    def _wrap(self, tool: FunctionTool, rule: Rule) -> FunctionTool:
        self._rules[tool.name] = rule
        invoke = tool.on_invoke_tool
        # An MCP call's result in the ledger is a CallToolResult.
        mcp = rule.channel is Channel.MCP
        store = stored_result if mcp else _same
        restore = tool_output if mcp else _same

        async def needs_approval(
            ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
        ) -> bool:
            # Prepared here, before the SDK decides to interrupt: the ledger,
            # not the RunState, says whether this exact call is approved.
            run = self._run()
            required = await self._required(rule, ctx, params, call_id)
            try:
                p = await self.client.prepare_tool(
                    run.run_id,
                    call_id,
                    rule.ledger_name,
                    rule.input_of(params),
                    effect=rule.effect,
                    require_approval=required,
                    channel=rule.channel,
                )
            except EffectdError as refusal:  # e.g. other arguments, same call
                raise LedgerInterruption(refusal) from refusal
            return p.decision is Decision.AWAIT_APPROVAL

        async def on_invoke_tool(ctx: ToolContext[Any], raw: str) -> Any:
            run = self._run()
            arguments = arguments_of(raw)
            required = await self._required(rule, ctx, arguments, ctx.tool_call_id)
            try:
                async with run.call(
                    rule.ledger_name,
                    rule.input_of(arguments),
                    call_id=ctx.tool_call_id,
                    effect=rule.effect,
                    require_approval=required,
                    timeout=rule.timeout,
                    unknown_on=rule.unknown_on,
                    retry_unknown=rule.retry_unknown,
                    channel=rule.channel,
                ) as step:
                    if not step.execute:
                        return restore(step.result)
                    output = await invoke(ctx, raw)
                    step.set_result(store(output))
                    return output
            except CallRejected:
                return DEFAULT_REJECTION_MESSAGE
            except ToolFailed as failed:
                return _error_text(failed.result.error_message)
            except (ToolCallStopped, OutcomeUnknown, EffectdError) as stopped:
                raise await interruption(self.client, run.run_id, stopped) from stopped
            except Exception as exc:
                if is_unknown(exc, rule.unknown_on):
                    raise await interruption(self.client, run.run_id, exc) from exc
                # Committed as an error result: the model reads it.
                return _error_text(str(exc))

        wrapped = copy.copy(tool)
        wrapped.on_invoke_tool = on_invoke_tool
        wrapped.needs_approval = needs_approval
        wrapped.timeout_seconds = None  # the ledger's deadline (`rule.timeout`)
        return wrapped

    async def _required(
        self, rule: Rule, ctx: RunContextWrapper[Any], params: Any, call_id: str
    ) -> bool:
        """The tool's own `needs_approval` (a bool, or its predicate)."""
        setting = rule.needs_approval
        if isinstance(setting, bool):
            return setting
        if not isinstance(params, dict):
            return True  # a predicate cannot inspect them: ask a human
        answer = setting(ctx, params, call_id)
        if inspect.isawaitable(answer):
            answer = await answer
        return bool(answer)


def _same(value: Any) -> Any:
    return value


def _error_text(message: str) -> str:
    return f"An error occurred while running the tool. Error: {message}"
