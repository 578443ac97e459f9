"""One driver per adapter (see `tests/adapters/README.md`): `DRIVERS` names
them; the suite runs every scenario against each."""

from __future__ import annotations

import importlib

from tests.adapters.drivers.base import Driver

# name -> module; each module has `DRIVER`. Imported lazily: a driver imports
# its framework, and a child process needs only its own.
MODULES = {
    "agent_framework": "tests.adapters.drivers.agent_framework",
    "langgraph": "tests.adapters.drivers.langgraph",
    "pydantic_ai": "tests.adapters.drivers.pydantic_ai",
    "openai_agents": "tests.adapters.drivers.openai_agents",
    "mcp": "tests.adapters.drivers.mcp",
    "node_langgraph": "tests.adapters.drivers.node_langgraph",
    "node_ai": "tests.adapters.drivers.node_ai",
    "node_openai_agents": "tests.adapters.drivers.node_openai_agents",
    "node_mcp": "tests.adapters.drivers.node_mcp",
    "google_adk": "tests.adapters.drivers.google_adk",
    "crewai": "tests.adapters.drivers.crewai",
}


def driver(name: str) -> Driver:
    module = importlib.import_module(MODULES[name])
    found: Driver = module.DRIVER
    return found
