"""The OpenAI Agents JS driver: `tests/adapters/node/openai-agents.mjs`,
run() with the SDK's ScriptedModel (responders answering the script's turn
for the input), the RunState saved in the work directory at an approval
interruption; the adapter is `@effectd/client/openai-agents`' AgentLedger,
the control the bare function tool. A pause is an SDK interruption or a
`LedgerInterruption`; a run without a saved state starts from its input
again (the SDK's way of running a finished step again)."""

from __future__ import annotations

from tests.adapters.drivers.node import NodeDriver

DRIVER = NodeDriver("node_openai_agents", "openai-agents", ("state.json",))
