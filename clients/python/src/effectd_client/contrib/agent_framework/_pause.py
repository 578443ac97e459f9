"""How `effectd_client.contrib.agent_framework` stops a call for a human, and
how a tool's result is stored and given back.

A pause is Agent Framework's own: a `function_approval_request` content the
middleware leaves as the call's result, which ends the run with it in
`AgentResponse.user_input_requests`. Its `additional_properties["effectd"]`
carries the ledger's facts (run id, call id, state, what a human must do:
`approve`, `reconcile`, `wait`). The caller answers it with
`request.to_function_approval_response(approved=True)` on the same session;
that answer only brings the call back to the middleware, which asks the
ledger again: it is not an approval (unless the middleware names an
approver, and then only for the arguments shown).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent_framework import Content, FunctionInvocationContext
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from effectd_client import AsyncClient, ToolCall

# Where a pause's ledger facts travel (the request's additional_properties).
METADATA_KEY = "effectd"


def effectd_facts(call: ToolCall, action: str) -> dict[str, Any]:
    """The ledger's facts a pause carries: the call, its state, what a human
    must do (`approve`, `reconcile`, `wait`, `mismatch`: refused, the
    arguments are not those the ledger holds the call for) and the `effectd ctl` command
    that shows it."""
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


def arguments_of(context: FunctionInvocationContext) -> dict[str, Any]:
    """The call's arguments as the JSON the ledger fingerprints."""
    args = context.arguments
    if isinstance(args, BaseModel):
        dumped: dict[str, Any] = args.model_dump(mode="json")
        return dumped
    return dict(to_jsonable_python(dict(args), fallback=str))


def pause(
    context: FunctionInvocationContext,
    call: ToolCall,
    action: str,
    arguments: Mapping[str, Any] | None = None,
) -> Content:
    """The approval request that stops the run on `call` (see the module
    docs); `arguments`: those shown, default the call's own."""
    shown = dict(arguments_of(context) if arguments is None else arguments)
    # The framework binds an answer to the call's occurrence: the request
    # carries its id.
    occurrence = context.metadata.get("function_call_occurrence_id") or call.call_id
    function_call = Content.from_function_call(
        call_id=call.call_id,
        name=context.function.name,
        arguments=shown,
        id=occurrence,
    )
    return Content.from_function_approval_request(
        id=occurrence,
        function_call=function_call,
        additional_properties={METADATA_KEY: effectd_facts(call, action)},
    )


def facts_of(request: Content) -> dict[str, Any] | None:
    """The ledger's facts of a pause the middleware made (None: not one)."""
    props = request.additional_properties or {}
    facts = props.get(METADATA_KEY)
    return dict(facts) if isinstance(facts, Mapping) else None


async def decide_request(
    client: AsyncClient,
    request: Content,
    *,
    approve: bool,
    approver: str,
    reason: str,
) -> ToolCall:
    """Records an approver's decision in the ledger on an approval pause of
    the middleware, for the arguments and revision the pause carried.

    Raises:
        KeyError: `request` is not an approval pause of the middleware.
        InputMismatch, RevisionConflict: The call changed since.
    """
    facts = facts_of(request)
    if not facts or facts.get("action") != "approve":
        raise KeyError(f"{request.id}: not an approval pause of effectd")
    return await client.decide_approval(
        facts["run_id"],
        facts["call_id"],
        approve=approve,
        approver=approver,
        reason=reason,
        expected_revision=facts["revision"],
        input_fingerprint=facts["input_fingerprint"],
    )


def stored(value: Any) -> Any:
    """A tool's result as the JSON the ledger stores: the text of a result
    of text items, else the contents' own JSON, else the value's."""
    if isinstance(value, list) and all(isinstance(c, Content) for c in value):
        if value and all(c.type == "text" for c in value):
            return "".join(c.text or "" for c in value)
        return [c.to_dict() for c in value]
    if isinstance(value, Content):
        return [value.to_dict()]
    return to_jsonable_python(value, fallback=str)


def restored(value: Any) -> Any:
    """A stored (or reconciled) result as the function result the model gets:
    text as text, stored contents as contents, other JSON as its text."""
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(c, dict) and "type" in c for c in value)
    ):
        return [Content.from_dict(c) for c in value]
    return json.dumps(value)
