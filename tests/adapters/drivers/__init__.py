"""One driver per adapter (see `tests/adapters/README.md`): `DRIVERS` names
them; the suite runs every scenario against each."""

from __future__ import annotations

import importlib

from tests.adapters.drivers.base import Driver

# name -> module; each module has `DRIVER`. Imported lazily: a driver imports
# its framework, and a child process needs only its own.
MODULES = {
    "langgraph": "tests.adapters.drivers.langgraph",
    "pydantic_ai": "tests.adapters.drivers.pydantic_ai",
    "google_adk": "tests.adapters.drivers.google_adk",
    "crewai": "tests.adapters.drivers.crewai",
}


def driver(name: str) -> Driver:
    module = importlib.import_module(MODULES[name])
    found: Driver = module.DRIVER
    return found
