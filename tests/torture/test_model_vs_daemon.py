"""The real daemon answers every operation exactly as the reference model of
the contract does, through restarts, lease expiries and retention windows
(issue 15, the model-based torture test).

`TORTURE_EXAMPLES` sets the number of random operation sequences (50 here,
thousands in `make torture-deep`), `TORTURE_STEPS` their length, and
`TORTURE_REPORT` a file to which the answers reached are written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis.stateful import run_state_machine_as_test

from tests.torture.machine import TortureMachine, settings

# The fast setting of `make test`: about a minute on a quiet machine.
FAST_EXAMPLES = 50


@pytest.mark.timeout(3600 * 6)
def test_the_daemon_matches_the_model() -> None:
    TortureMachine.tally.clear()
    try:
        run_state_machine_as_test(TortureMachine, settings=settings(FAST_EXAMPLES))
    finally:
        tally = dict(sorted(TortureMachine.tally.items()))
        print(json.dumps(tally, indent=1))
        report = os.environ.get("TORTURE_REPORT")
        if report:
            Path(report).write_text(json.dumps(tally, indent=1) + "\n")
