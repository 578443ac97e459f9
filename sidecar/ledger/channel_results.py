"""Which results a call's channel can return, as a pure rule.

The adapters of a channel hand the agent the stored result of a call in the
form the channel's calls return. An MCP call's adapters (the Python
`effectd_client.contrib.mcp` and the Agents SDK's MCP tools, the Node
`@effectd/client/mcp`) return an MCP `CallToolResult`, so an MCP call's
result is one: committed OK, an object with a `content` list of content
blocks; committed with the error code `MCP_TOOL_ERROR`, that object (the
tool's own `isError` answer) or nothing. Reconcile applies the rule to the
result an operator found: a result the call's adapters could never return
would reach the resumed agent as something it cannot read, and a
COMMITTED call is never reconciled again. The other channels' calls return
any JSON or bytes.

The check is structural, after the MCP specification's schema: the fields
each kind of content block requires, with their JSON types.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sidecar.ledger.model import Channel, Outcome, PayloadKind, Result

# The error code of an MCP tool's own error answer (`isError: true`), as the
# MCP adapters commit it.
MCP_TOOL_ERROR = "MCP_TOOL_ERROR"
# The shape an MCP call's result takes, as an operator would write it.
CALL_TOOL_RESULT_EXAMPLE = (
    '{"content": [{"type": "text", "text": "..."}], "isError": false}'
)
# The string fields each kind of content block requires (MCP schema).
_BLOCKS: Mapping[str, tuple[str, ...]] = {
    "text": ("text",),
    "image": ("data", "mimeType"),
    "audio": ("data", "mimeType"),
    "resource_link": ("uri", "name"),
    "resource": (),
}


def result_fault(channel: Channel, result: Result) -> str | None:
    """Why `result` is not one a call on `channel` can return, saying the
    shape wanted; None when it is."""
    if channel is not Channel.MCP:
        return None
    if result.outcome is Outcome.ERROR and result.error_code != MCP_TOOL_ERROR:
        return None
    if result.outcome is Outcome.ERROR and result.payload is None:
        return None
    fault = _call_tool_result_fault(result)
    if fault is None:
        return None
    return (
        "an MCP call's result is an MCP CallToolResult object, e.g. "
        f"{CALL_TOOL_RESULT_EXAMPLE}: {fault}"
    )


def _json_of(result: Result) -> tuple[Any, bool]:
    """The result's JSON value, and whether it has one."""
    payload = result.payload
    if payload is None or payload.kind is not PayloadKind.JSON:
        return None, False
    try:
        return json.loads(payload.data), True
    except (ValueError, RecursionError):
        return None, False


def _call_tool_result_fault(result: Result) -> str | None:
    value, is_json = _json_of(result)
    if not is_json:
        return "the result is not JSON"
    if not isinstance(value, dict):
        return f"the result is {_kind(value)}, not an object"
    content = value.get("content")
    if not isinstance(content, list):
        return "its content is not a list of content blocks"
    for i, block in enumerate(content):
        fault = _block_fault(block)
        if fault is not None:
            return f"content[{i}] {fault}"
    return _flags_fault(value, result.outcome)


def _flags_fault(value: dict[str, Any], outcome: Outcome) -> str | None:
    if "isError" in value and not isinstance(value["isError"], bool):
        return "its isError is not true or false"
    if outcome is Outcome.OK and value.get("isError") is True:
        return (
            "isError is true in a successful result (a tool's error answer is "
            f"an error result with the code {MCP_TOOL_ERROR})"
        )
    if not isinstance(value.get("_meta", {}), dict | None):
        return "its _meta is not an object"
    return None


def _block_fault(block: Any) -> str | None:
    if not isinstance(block, dict):
        return f"is {_kind(block)}, not a content block object"
    kind = block.get("type")
    if not isinstance(kind, str) or kind not in _BLOCKS:
        known = ", ".join(_BLOCKS)
        return f"has type {json.dumps(kind)}, not one of {known}"
    for name in _BLOCKS[kind]:
        if not isinstance(block.get(name), str):
            return f"(type {kind}) needs {name} as a string"
    if kind == "resource":
        resource = block.get("resource")
        if not (
            isinstance(resource, dict)
            and isinstance(resource.get("uri"), str)
            and (
                isinstance(resource.get("text"), str)
                or isinstance(resource.get("blob"), str)
            )
        ):
            return "(type resource) needs a resource object with uri and text or blob"
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return "a list" if isinstance(value, list) else "an object"
