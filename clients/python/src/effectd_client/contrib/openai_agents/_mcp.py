"""The result of an MCP tool of `effectd_client.contrib.openai_agents`, in the ledger
and back.

An MCP call's result in the ledger is an MCP `CallToolResult` (the daemon
refuses to reconcile an MCP call with anything else; `effectd_client.contrib.mcp`
and `@effectd/client/mcp` store and return one). The Agents SDK turns the
server's `CallToolResult` into its own tool output (a text or image item, a
list of them, or the structured content as JSON text); that output is
stored as the `CallToolResult` it came from, and a stored `CallToolResult`,
committed or reconciled, is handed to the SDK as the output it makes of
one: text blocks as text items, images as image items, other blocks as
their JSON text. A stored value that is no `CallToolResult` (recorded
before this) is handed over as it is, as the SDK took it then.
Imported only with the `openai-agents` extra.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_DATA_URL = "data:"


def stored_result(output: Any) -> dict[str, Any]:
    """The `CallToolResult` (its JSON) of the SDK's output of an MCP tool."""
    items = output if isinstance(output, list) else [output]
    return {"content": [_block(item) for item in items], "isError": False}


def tool_output(stored: Any) -> Any:
    """The SDK's output of a stored `CallToolResult`; anything else as it is."""
    if not _is_call_tool_result(stored):
        return stored
    items = [_item(block) for block in stored["content"]]
    return items[0] if len(items) == 1 else items


def _is_call_tool_result(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("content"), list)
        and all(isinstance(b, Mapping) for b in value["content"])
    )


def _block(item: Any) -> dict[str, Any]:
    """One content block of an SDK output item."""
    if isinstance(item, Mapping) and item.get("type") == "text":
        return {"type": "text", "text": str(item.get("text", ""))}
    if isinstance(item, Mapping) and item.get("type") == "image":
        url = str(item.get("image_url", ""))
        head, _, data = url.partition(";base64,")
        if head.startswith(_DATA_URL) and data:
            mime = head[len(_DATA_URL) :]
            return {"type": "image", "data": data, "mimeType": mime}
    text = item if isinstance(item, str) else json.dumps(item)
    return {"type": "text", "text": text}


def _item(block: Mapping[str, Any]) -> dict[str, Any]:
    """The SDK's output item of one content block (as the SDK makes it)."""
    if block.get("type") == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if block.get("type") == "image":
        mime, data = block.get("mimeType", ""), block.get("data", "")
        return {"type": "image", "image_url": f"data:{mime};base64,{data}"}
    return {"type": "text", "text": json.dumps(dict(block))}
