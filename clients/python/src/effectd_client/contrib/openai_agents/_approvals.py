"""Approvals of `effectd_client.contrib.openai_agents`: the SDK's tool approval
interruptions decided in effectd, bound to the call's exact arguments.

`AgentLedger` takes these methods from `LedgerApprovals`; the rule of a
wrapped tool (`Rule`) and the decoding of the model's arguments are shared
with it. Imported only with the `openai-agents` extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agents import ToolApprovalItem
from agents.run_state import RunState

from effectd_client import (
    AsyncClient,
    AsyncRun,
    Channel,
    Effect,
    NotFound,
    State,
    ToolCall,
)
from effectd_client.extend import Matcher

# The error code of a call an approver rejected (contract §4.5).
APPROVAL_REJECTED = "APPROVAL_REJECTED"
# What the model reads for a call an approver rejected (the SDK's default).
DEFAULT_REJECTION_MESSAGE = "Tool execution was not approved."


class NoLedgerRun(RuntimeError):
    """A ledgered tool ran outside `AgentLedger.run(run_id)`: there is no run
    id to key the call by (never a made-up one)."""


class ApprovalMismatch(ValueError):
    """The approval item's arguments are not the ones effectd recorded for the
    call: the approver would authorize something they did not see."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """How one wrapped tool is called in the ledger."""

    ledger_name: str
    effect: Effect
    # The tool's own `needs_approval`: a bool, or its per-call predicate.
    needs_approval: Any
    channel: Channel = Channel.TOOL
    # For an MCP tool: the operator's server name and the tool's own name.
    server: str | None = None
    tool: str = ""
    unknown_on: tuple[Matcher, ...] = ()
    timeout: float | None = None
    retry_unknown: bool = False

    def input_of(self, arguments: Any) -> Any:
        """The recorded input: the model's arguments (for MCP, with the
        server and the tool)."""
        if self.server is None:
            return arguments
        return {"server": self.server, "tool": self.tool, "arguments": arguments}


def arguments_of(raw: str | None) -> Any:
    """The model's arguments as recorded: the JSON value, else the text."""
    if raw is None or not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class LedgerApprovals:
    """`approve`, `reject` and `apply_decisions` of `AgentLedger`."""

    client: AsyncClient
    _rules: dict[str, Rule]

    def _run(self, run_id: str | None = None) -> AsyncRun:
        raise NotImplementedError  # pragma: no cover

    async def approve(
        self,
        item: ToolApprovalItem,
        *,
        approver: str,
        reason: str = "",
        state: RunState[Any, Any] | None = None,
        run_id: str | None = None,
    ) -> ToolCall:
        """Approves the interrupted call in effectd, bound to the arguments the
        item shows, and in `state` (when given) for the SDK.

        Raises:
            ApprovalMismatch: effectd recorded other arguments for the call.
            EffectdError: The daemon refused (e.g. already decided, or the
                client lacks the approver role).
        """
        call = await self._decide(item, True, approver, reason or "approved", run_id)
        if state is not None:
            state.approve(item)
        return call

    async def reject(
        self,
        item: ToolApprovalItem,
        *,
        approver: str,
        reason: str = "",
        state: RunState[Any, Any] | None = None,
        run_id: str | None = None,
    ) -> ToolCall:
        """Rejects the interrupted call in effectd (and in `state`): the model
        reads the rejection message, and the call never runs."""
        call = await self._decide(item, False, approver, reason or "rejected", run_id)
        if state is not None:
            state.reject(item, rejection_message=DEFAULT_REJECTION_MESSAGE)
        return call

    async def apply_decisions(
        self, state: RunState[Any, Any], *, run_id: str | None = None
    ) -> list[ToolApprovalItem]:
        """Applies effectd's approvals and rejections to a RunState's pending
        interruptions; returns the items still waiting.

        Call it on a RunState restored after a crash (or whenever approvers
        decide outside the process, `effectd ctl approve`, the console): the
        SDK keeps an interruption pending on resume, it does not ask
        `needs_approval` again.
        """
        run = self._run(run_id)
        waiting = []
        for item in state.get_interruptions():
            rule = self._rules.get(item.name or item.tool_name or "")
            if item.call_id is None or rule is None:
                waiting.append(item)
                continue
            try:
                call = await self.client.get_tool_call(run.run_id, item.call_id)
            except NotFound:
                waiting.append(item)
                continue
            if _rejected(call):
                state.reject(item, rejection_message=DEFAULT_REJECTION_MESSAGE)
            elif _approved(call) and _shows(
                call, rule.input_of(arguments_of(item.arguments))
            ):
                # Approved for these arguments (or past it): the ledger
                # decides at the start whether it runs, replays or needs
                # reconciling.
                state.approve(item)
            else:
                waiting.append(item)
        return waiting

    async def _decide(
        self,
        item: ToolApprovalItem,
        approve: bool,
        approver: str,
        reason: str,
        run_id: str | None,
    ) -> ToolCall:
        run = self._run(run_id)
        call_id = item.call_id
        rule = self._rules.get(item.name or item.tool_name or "")
        if call_id is None or rule is None:
            raise ValueError(f"{item.name}: not a call of a ledgered tool")
        arguments = arguments_of(item.arguments)
        try:
            call = await self.client.get_tool_call(run.run_id, call_id)
        except NotFound:
            # The SDK asked for approval without asking the ledger (arguments
            # a predicate cannot inspect): record the call, waiting.
            p = await self.client.prepare_tool(
                run.run_id,
                call_id,
                rule.ledger_name,
                rule.input_of(arguments),
                effect=rule.effect,
                require_approval=True,
                channel=rule.channel,
            )
            call = p.call
        shown = rule.input_of(arguments)
        awaiting = call.state is State.AWAITING_APPROVAL
        if awaiting and (call.kept_input_json is None or not _shows(call, shown)):
            raise ApprovalMismatch(
                f"{call_id}: effectd recorded other arguments than the "
                "approval item shows"
            )
        return await self.client.decide_approval(
            run.run_id,
            call_id,
            approve=approve,
            approver=approver,
            reason=reason,
            expected_revision=call.revision,
            input_fingerprint=call.input_fingerprint,
        )


def _rejected(call: ToolCall) -> bool:
    result = call.result
    return (
        call.state is State.COMMITTED
        and result is not None
        and not result.ok
        and result.error_code == APPROVAL_REJECTED
    )


def _approved(call: ToolCall) -> bool:
    """An approver approved the call (it required approval and no longer
    waits for it)."""
    return call.approval_required and call.state is not State.AWAITING_APPROVAL


def _shows(call: ToolCall, recorded_input: Any) -> bool:
    """The input effectd kept for the call is `recorded_input` (True when it
    keeps none any more: the daemon compares fingerprints at the start)."""
    kept = call.kept_input_json
    return kept is None or json.loads(kept) == recorded_input
