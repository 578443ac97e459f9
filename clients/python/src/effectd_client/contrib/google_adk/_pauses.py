"""The pauses of `effectd_client.contrib.google_adk`: what a pause's
payload tells a human, the calls a session's events leave paused, and an
approver's decision recorded in effectd from one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from effectd_client import AsyncClient, ToolCall

# The ledger's facts in a pause's `toolConfirmation.payload`.
PAUSE_KEY = "effectd"
# The function call ADK makes for a tool confirmation.
CONFIRMATION_CALL = "adk_request_confirmation"


class ApprovalMismatch(ValueError):
    """A decision shows other arguments than the call waiting has."""


class StillWaiting(Exception):
    """An answered pause whose call still waits for a human in effectd
    (undecided, unreconciled, or answered with other arguments): nothing
    ran, and the invocation stops with the pause still open
    (`paused_calls`); answer it again once it is settled. `facts` are the
    ledger's, as a pause's payload has them."""

    def __init__(self, facts: Mapping[str, Any]) -> None:
        self.facts = dict(facts)
        refused = f"; refused: {facts['refused']}" if facts.get("refused") else ""
        super().__init__(
            f"{facts['call_id']} still waits ({facts['action']}, {facts['state']})"
            f"{refused}: {facts['show']}"
        )


def pause_facts(call: ToolCall, action: str) -> dict[str, Any]:
    """What a pause tells a human: the ledger's call, its state, what to do
    (`approve`, `reconcile`, `wait`) and the `effectd ctl` command showing it."""
    return {
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


def paused_calls(events: Any) -> list[dict[str, Any]]:
    """The calls a session's events leave paused: per call, the latest
    confirmation asked for it (`confirmation_id`, what the answer's
    FunctionResponse names), the original call (`call_id`, `name`,
    `arguments`) and the ledger's facts when it was asked (`effectd`). A call
    is paused until a tool result other than a pause's placeholder answers
    it (an answer that still waits raised `StillWaiting` and left it open)."""
    waiting: dict[str, dict[str, Any]] = {}
    for event in events:
        asked = event.actions.requested_tool_confirmations or {}
        for part in (event.content.parts if event.content else None) or []:
            fc, fr = part.function_call, part.function_response
            if fc is not None and fc.name == CONFIRMATION_CALL:
                args = fc.args or {}
                original = args.get("originalFunctionCall") or {}
                payload = (args.get("toolConfirmation") or {}).get("payload") or {}
                waiting[str(original.get("id"))] = {
                    "confirmation_id": fc.id,
                    "call_id": original.get("id"),
                    "name": original.get("name"),
                    "arguments": original.get("args") or {},
                    PAUSE_KEY: payload.get(PAUSE_KEY),
                }
            elif fr is not None and event.author != "user" and fr.id not in asked:
                waiting.pop(str(fr.id), None)
    return list(waiting.values())


async def decide(
    client: AsyncClient,
    paused: Mapping[str, Any],
    *,
    approve: bool,
    approver: str,
    reason: str,
    arguments: Mapping[str, Any] | None = None,
) -> ToolCall:
    """Records an approver's decision in effectd on a call paused for
    approval (an item of `paused_calls`), for the arguments and revision the
    pause showed.

    Raises:
        ApprovalMismatch: `arguments` are given and are not the call's.
        KeyError: The pause is not an approval of this adapter.
        InputMismatch, RevisionConflict: The call changed since.
    """
    facts = paused.get(PAUSE_KEY)
    if not isinstance(facts, Mapping) or facts.get("action") != "approve":
        raise KeyError(f"{paused.get('call_id')}: not an approval paused by effectd")
    if arguments is not None and json_text(arguments) != json_text(
        paused.get("arguments")
    ):
        raise ApprovalMismatch(
            f"the decision shows other arguments ({arguments!r}) than the call "
            f"{facts['call_id']!r} has"
        )
    return await client.decide_approval(
        facts["run_id"],
        facts["call_id"],
        approve=approve,
        approver=approver,
        reason=reason,
        expected_revision=facts["revision"],
        input_fingerprint=facts["input_fingerprint"],
    )


def json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
