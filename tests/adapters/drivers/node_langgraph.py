"""The LangGraph.js driver: `tests/adapters/node/langgraph.mjs`, a StateGraph
of a scripted BaseChatModel and a ToolNode, checkpointed in a file of the
work directory (durability 'sync'); the adapter is
`@effectd/client/langgraph`'s `LedgeredToolCalls.toolNode`, the control
LangGraph's own ToolNode. A pause is the graph's `__interrupt__`; an answer
is `Command({ resume })`; a finished step is run again by forking the thread
from the checkpoint before its tools node (time travel)."""

from __future__ import annotations

from tests.adapters.drivers.node import NodeDriver

DRIVER = NodeDriver("node_langgraph", "langgraph", ("checkpoints.json",))
