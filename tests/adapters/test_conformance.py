"""The adapter conformance suite: every scenario (`scenarios.SCENARIOS`)
against every adapter's driver (`drivers.MODULES`), each with its negative
control (the unwrapped tool: the scenario must catch it). A scenario a
framework cannot do by its design is reported not applicable, with the
driver's reason; the run ends with the table (`conftest.py`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from effectd_client.testing import TestDaemon, running_daemon
from tests.adapters import scenarios
from tests.adapters.drivers import MODULES, driver
from tests.adapters.world import PropertyBroken, Scenario

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def effectd() -> Iterator[TestDaemon]:
    """One daemon (real clock: a killed call's lease runs out)."""
    with running_daemon() as daemon:
        yield daemon


def stage(
    name: str, effectd: TestDaemon, workdir: Path, *, wrapped: bool
) -> scenarios.Stage:
    return scenarios.Stage(
        driver(name), effectd.target, workdir, f"r-{uuid.uuid4().hex[:10]}", wrapped
    )


def not_applicable(name: str, scenario: Scenario) -> str | None:
    return driver(name).not_applicable.get(scenario)


@pytest.mark.parametrize("scenario", list(Scenario), ids=lambda s: s.name.lower())
@pytest.mark.parametrize("adapter", list(MODULES))
def test_the_adapter_keeps_the_scenarios_property(
    adapter: str,
    scenario: Scenario,
    effectd: TestDaemon,
    short_tmp: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """The adapter passes the scenario (or declares, with a reason, that its
    framework cannot do it)."""
    reason = not_applicable(adapter, scenario)
    if reason is not None:
        assert reason.strip(), "a scenario is not applicable only with a reason"
        record_property("conformance", f"n/a: {reason}")
        return
    scenarios.SCENARIOS[scenario](stage(adapter, effectd, short_tmp, wrapped=True))
    record_property("conformance", "pass")


@pytest.mark.parametrize("scenario", list(Scenario), ids=lambda s: s.name.lower())
@pytest.mark.parametrize("adapter", list(MODULES))
def test_negative_control_the_unwrapped_tool_is_caught(
    adapter: str,
    scenario: Scenario,
    effectd: TestDaemon,
    short_tmp: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """The same scenario and driver with the bare tool breaks the property,
    and the scenario says so (unless nothing can break there: the reason is
    shown)."""
    reason = not_applicable(adapter, scenario) or scenarios.CONTROLS.get(scenario)
    if reason is not None:
        record_property("control", f"n/a: {reason}")
        return
    with pytest.raises(PropertyBroken):
        scenarios.SCENARIOS[scenario](stage(adapter, effectd, short_tmp, wrapped=False))
    record_property("control", "caught")
