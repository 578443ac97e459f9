"""The Google ADK driver: its agent runs in `.venv-adk` (ADK's pins cannot
live beside the daemon's), driven from the test process by a `VenvDriver`;
the framework's side is `tests/adapters/isolated/google_adk.py`."""

from __future__ import annotations

from tests.adapters.isolated import VenvDriver

DRIVER = VenvDriver("google_adk", ".venv-adk", "tests.adapters.isolated.google_adk")
