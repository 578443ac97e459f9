"""Every MCP `tools/call` through the ledger: `LedgeredSession`.

Install with `pip install effectd-client[mcp]` (the official `mcp` package);
`import effectd_client` alone never imports it. The wrapper sits on an
initialized `mcp.ClientSession` and runs each `call_tool` through the safe call
(`AsyncRun.call`, channel MCP), keyed by the agent's run id and the model's
tool call id:

  committed before (same call id)     -> its stored result; the server is not
                                         contacted for the call
  result with isError false           -> committed OK, the result stored
  result with isError true            -> committed ERROR `MCP_TOOL_ERROR` with
                                         the whole result: the tool ran, so it
                                         is never run again; a repeat returns
                                         the same isError result
  any exception from the session      -> UNKNOWN (ReportUnknown), the session
    (connection closed, the server         invalidated, `McpConnectionLost`
    killed, a timeout, an error            raised; never sent again. The SDK
    answer, the caller cancelled)          does not tell an error the server
                                           sent from one it made up locally
  the policy requires approval        -> `ApprovalPending`: an approver decides
                                         (DecideApproval), the same call id is
                                         called again
  unknown outcome before (same id)    -> `ReconciliationNeeded` (SIDE_EFFECT),
                                         `RetryRequired` (READ or
                                         IDEMPOTENT_WRITE: the daemon never
                                         starts an MCP call of unknown outcome
                                         again, ADR-010 D5)

After a transport failure the session refuses every further call
(`SessionInvalidated`, ADR-010 D5) until the caller reconnects and wraps the
new session. The SDK's transports and sessions run in task groups, which
wrap what the block raises in `ExceptionGroup`s: `unwrapped()` around them
re-raises the ledger's exception (`McpConnectionLost`, which names the run
and the call, a `ToolCallStopped`) as itself.

A stored result is handed back as the `CallToolResult` it is (Reconcile
refuses an MCP call's result of another shape); one that is not (a plain
value recorded before the daemon checked) reaches the caller as a result
with that value as its text, never as a validation error.

The effect of each tool comes from the operator's `McpPolicy`
(`effectd_client.extend`); the ledger records it as the tool
`mcp://{server}/{tool}` (the daemon's policy file can force it to SIDE_EFFECT
by that name), with the input `{"server", "tool", "arguments"}`. An
IDEMPOTENT_WRITE call carries its key `{run_id}:{call_id}` in the request's
`_meta` as `dev.effectd/idempotency-key`.

    async with ClientSession(read, write) as session:
        await session.initialize()
        tools = LedgeredSession(session, AsyncRun(effectd, run_id),
                                server="mail", policy=policy)
        await tools.list_tools()
        result = await tools.call_tool("send", {"to": "a@b.c"},
                                       call_id=tool_call.id)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from mcp import ClientSession
from mcp.types import (
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    RequestParamsMeta,
    TextContent,
    Tool,
)
from pydantic import ValidationError

from effectd_client import (
    AsyncRun,
    Channel,
    Effect,
    EffectdError,
    OutcomeUnknown,
    ToolCallStopped,
    ToolFailed,
)
from effectd_client.extend import McpDecision, McpPolicy, McpServerPolicy
from effectd_client.policy import EFFECT_NAMES, PolicyError, ToolRule

__all__ = [
    "EFFECT_NAMES",
    "KEY_META",
    "MCP_TOOL_ERROR",
    "LedgeredSession",
    "McpConnectionLost",
    "McpDecision",
    "McpPolicy",
    "McpServerPolicy",
    "PolicyError",
    "SessionInvalidated",
    "ToolRule",
    "ledger_tool_name",
    "unwrapped",
]

# The error code of a committed tool result with isError.
MCP_TOOL_ERROR = "MCP_TOOL_ERROR"
# Where an IDEMPOTENT_WRITE call's key travels: the request's `_meta`, under a
# reverse-DNS prefix the MCP specification leaves to implementations.
KEY_META = "dev.effectd/idempotency-key"
# Pages of tools/list read at most (a bounded loop over a server's cursors).
MAX_TOOL_PAGES = 100


class SessionInvalidated(Exception):
    """The session lost its connection while a call was in flight: no call
    goes through it again. Reconnect, and wrap the new session."""


class McpConnectionLost(OutcomeUnknown):
    """The connection failed while the call was in flight: its outcome is
    unknown (recorded UNKNOWN), the session is invalidated, and the call is
    never sent again. `run_id` and `call_id` name the call to reconcile."""

    def __init__(self, message: str, *, run_id: str, call_id: str) -> None:
        super().__init__(message)
        self.run_id, self.call_id = run_id, call_id


class _ToolError(Exception):
    """A result with isError, carried to the safe call as an error result."""

    error_code = MCP_TOOL_ERROR

    def __init__(self, result: CallToolResult) -> None:
        super().__init__(_text_of(result))
        self.result = result
        self.error_result = _stored(result)


def ledger_tool_name(server: str, tool: str) -> str:
    """The name a call is recorded under: `mcp://{server}/{tool}`."""
    return f"mcp://{server}/{tool}"


def _stored(result: CallToolResult) -> Any:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _restored(value: Any, *, is_error: bool = False) -> CallToolResult:
    """The CallToolResult a stored result holds; a value that is none (a
    plain value, recorded before the daemon checked the shape of an MCP
    call's reconciled result) as a result whose text it is."""
    if isinstance(value, dict):
        try:
            return CallToolResult.model_validate(value)
        except ValidationError:
            pass
    text = value if isinstance(value, str) else json.dumps(value)
    return CallToolResult(
        content=[TextContent(type="text", text=text)], is_error=is_error
    )


@contextmanager
def unwrapped() -> Iterator[None]:
    """Re-raises the ledger's exception that an MCP transport or session
    wrapped in an `ExceptionGroup` (their task groups wrap whatever their
    block raises) as itself, so that `except McpConnectionLost` (or
    `ReconciliationNeeded`, `ApprovalPending`...) catches it:

        try:
            with unwrapped():
                async with (
                    stdio_client(params) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    ...
        except McpConnectionLost as lost:
            ...  # lost.run_id, lost.call_id: the call to reconcile

    A group that holds no such exception, or several, is raised as it is.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        ours = [e for e in _leaves(group) if isinstance(e, _LEDGER_ERRORS)]
        if len(ours) != 1:
            raise
        # Its own cause (the SDK's error) stays the one shown.
        raise ours[0] from ours[0].__cause__


# What the wrapper and the ledger raise about a call: what `unwrapped` lifts
# out of the groups the MCP transports' task groups wrap it in.
_LEDGER_ERRORS = (
    EffectdError,
    OutcomeUnknown,
    ToolCallStopped,
    SessionInvalidated,
)


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def _text_of(result: CallToolResult) -> str:
    """The error message (the safe call bounds it to what the daemon takes)."""
    texts = [getattr(c, "text", "") for c in result.content]
    return " ".join(t for t in texts if t) or "the tool reported an error"


class LedgeredSession:
    """An MCP client session whose tool calls go through the ledger.

    Args:
        session: An initialized `mcp.ClientSession`.
        run: The agent run (`AsyncRun`) whose id keys every call.
        server: The operator's name of this server (the policy's key; never
            the server's self-reported name).
        policy: The operator's MCP policy; an empty one makes every tool a
            SIDE_EFFECT without approval.
        timeout: Seconds a call may run; past it the outcome is unknown.
    """

    def __init__(
        self,
        session: ClientSession,
        run: AsyncRun,
        *,
        server: str,
        policy: McpPolicy | None = None,
        timeout: float | None = None,
    ) -> None:
        if not server or "/" in server:
            raise ValueError("server: a non-empty name without '/'")
        self.session, self.run, self.server = session, run, server
        self.policy = policy or McpPolicy()
        self.timeout = timeout
        self._tools: dict[str, Tool] = {}
        self._invalidated: BaseException | None = None

    @property
    def invalidated(self) -> bool:
        """True once a transport failure ended this session for calls."""
        return self._invalidated is not None

    async def list_tools(self) -> ListToolsResult:
        """Every tool of the server (all pages), remembered for the policy."""
        self._check_alive()
        result = await self.session.list_tools()
        tools = list(result.tools)
        for _ in range(MAX_TOOL_PAGES):
            if not result.next_cursor:
                break
            result = await self.session.list_tools(
                params=PaginatedRequestParams(cursor=result.next_cursor)
            )
            tools.extend(result.tools)
        self._tools = {t.name: t for t in tools}
        return ListToolsResult(tools=tools)

    async def decide(self, name: str) -> McpDecision:
        """The effect and approval a call of `name` is prepared with."""
        if name not in self._tools:
            await self.list_tools()
        tool = self._tools.get(name)
        annotations = tool.annotations if tool is not None else None
        return self.policy.decide(self.server, name, annotations)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        call_id: str,
        read_timeout_seconds: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> CallToolResult:
        """Calls the tool at most once for `call_id` (see the module docs).

        Args:
            name: The tool.
            arguments: Its arguments (the input fingerprinted).
            call_id: The model's tool call id; the same id on a resumed run
                returns the stored result.
            read_timeout_seconds: Passed to the session.
            meta: Extra `_meta` for the request (not fingerprinted).

        Raises:
            SessionInvalidated: The session lost its connection earlier.
            McpConnectionLost: This call's connection failed (UNKNOWN).
            ToolCallStopped: The ledger says not to run it (`ApprovalPending`,
                `ReconciliationNeeded`, `RetryRequired`, `CallRejected`...).
        """
        self._check_alive()
        decision = await self.decide(name)
        args = dict(arguments or {})
        call_input = {"server": self.server, "tool": name, "arguments": args}
        try:
            async with self.run.call(
                ledger_tool_name(self.server, name),
                call_input,
                call_id=call_id,
                effect=decision.effect,
                require_approval=decision.require_approval,
                timeout=self.timeout,
                channel=Channel.MCP,
            ) as step:
                if not step.execute:
                    return _restored(step.result)
                request_meta = dict(meta or {})
                if decision.effect is Effect.IDEMPOTENT_WRITE and step.idempotency_key:
                    request_meta[KEY_META] = step.idempotency_key
                result = await self._send(
                    name, args, call_id, read_timeout_seconds, request_meta or None
                )
                if result.is_error:
                    raise _ToolError(result)
                step.set_result(_stored(result))
                return result
        except _ToolError as error:
            return error.result
        except ToolFailed as failed:
            if failed.error_code == MCP_TOOL_ERROR and failed.result.value is not None:
                return _restored(failed.result.value, is_error=True)
            raise

    async def _send(
        self,
        name: str,
        args: dict[str, Any],
        call_id: str,
        read_timeout_seconds: float | None,
        meta: dict[str, Any] | None,
    ) -> CallToolResult:
        try:
            return await self.session.call_tool(
                name,
                args,
                read_timeout_seconds,
                meta=cast("RequestParamsMeta | None", meta),
            )
        except asyncio.CancelledError as exc:
            self._invalidated = exc
            raise
        except Exception as exc:
            # Sent, or maybe sent: whatever failed, the server may have run it.
            self._invalidated = exc
            run_id = self.run.run_id
            raise McpConnectionLost(
                f"{self.server}/{name}, call {call_id} of run {run_id}: the "
                f"connection failed during the call ({exc!r}); its outcome is "
                "unknown (recorded UNKNOWN) and it is never sent again: "
                f"reconcile it (effectd ctl show {run_id} {call_id})",
                run_id=run_id,
                call_id=call_id,
            ) from exc

    def _check_alive(self) -> None:
        if self._invalidated is not None:
            raise SessionInvalidated(
                f"the session to {self.server} lost its connection during a call "
                f"({self._invalidated!r}); reconnect and wrap the new session"
            )
