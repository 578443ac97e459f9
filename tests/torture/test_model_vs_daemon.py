"""The real daemon answers every operation exactly as the reference model of
the contract does, through restarts, lease expiries and retention windows
(issue 15, the model-based torture test)."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from tests.torture.machine import TortureMachine, settings


@pytest.mark.timeout(1800)
def test_the_daemon_matches_the_model() -> None:
    run_state_machine_as_test(TortureMachine, settings=settings(25))
