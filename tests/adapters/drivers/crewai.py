"""The CrewAI driver: its agent runs in `.venv-crewai` (a CrewAI release that
fits the client's pins, beside none of the daemon's test tools), driven from
the test process by a `VenvDriver`; the framework's side is
`tests/adapters/isolated/crewai.py`."""

from __future__ import annotations

from tests.adapters.isolated import VenvDriver
from tests.adapters.world import Scenario

_ONE_CALL = "CrewAI's agent loop takes one tool call per model answer (ReAct): "
NOT_APPLICABLE = {
    Scenario.PARALLEL_2: _ONE_CALL + "no parallel calls",
    Scenario.PARALLEL_3: _ONE_CALL + "no parallel calls",
    Scenario.RECONCILE: _ONE_CALL + "no parallel calls to die together",
}

DRIVER = VenvDriver(
    "crewai", ".venv-crewai", "tests.adapters.isolated.crewai", NOT_APPLICABLE
)
