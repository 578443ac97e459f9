"""The scenarios, written once: each takes a `Stage` (a driver, its daemon,
a work directory) and raises `world.PropertyBroken` when the adapter breaks
the property it checks. A negative control runs the same scenario with the
unwrapped tool (`Stage.wrapped` False), and must be caught.

`CONTROLS` names the scenarios whose control cannot break anything, and why
(the table shows it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from effectd_client import AsyncClient, Client, State
from tests.adapters import world
from tests.adapters.child import spec_of
from tests.adapters.drivers.base import Agent, Answer, Driver, Outcome, PauseKind
from tests.adapters.world import KillPoint, PropertyBroken, Scenario, Script
from tests.support.restarts import restarting

ROOT = Path(__file__).resolve().parents[2]
CHILD_SECONDS = 120.0
# More kill points (parallel calls killed too) with EFFECTD_CONFORMANCE_DEEP=1.
DEEP = os.environ.get("EFFECTD_CONFORMANCE_DEEP", "") not in ("", "0")
KILL_SHAPES: tuple[tuple[int, ...], ...] = ((1,), (2,), (1, 3)) if DEEP else ((1,),)
# Operator's rounds of reconciling a run before the suite gives up.
ROUNDS = 5

CONTROLS = {
    Scenario.KILL_BEFORE: "nothing acted before the kill: a bare tool acts once too",
    Scenario.KILL_AFTER: "the framework's own saved state holds the result",
    Scenario.KILL_AFTER_MODEL: "the framework's own saved state holds the result",
    Scenario.DAEMON_RESTART: "a bare tool does not use the daemon",
}


@dataclass(frozen=True, slots=True)
class Stage:
    driver: Driver
    target: str
    workdir: Path
    run_id: str
    wrapped: bool = True

    def agent(self, script: Script, **kw: Any) -> Agent:
        return Agent(
            self.target, self.workdir, self.run_id, script, wrapped=self.wrapped, **kw
        )


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise PropertyBroken(what)


def expect_final(out: Outcome, results: list[str]) -> None:
    expect(not out.paused, f"still paused: {out.paused}")
    want = world.final_text(results)
    expect(out.final == want, f"the model saw {out.final!r}, not {want!r}")


def booked(script: Script) -> list[str]:
    return [world.result_text(c.item) for turn in script for c in turn]


def exactly_once(stage: Stage, script: Script) -> None:
    counted = world.check_at_most_once(stage.workdir)
    for turn in script:
        for c in turn:
            expect(counted[c.item] == 1, f"{c.item} acted {counted[c.item]} times")


def run_and_rerun(stage: Stage, script: Script) -> None:
    """The run, then the same run from its start (a retried job): each call
    acts once; the rerun gets the stored results."""
    agent = stage.agent(script)
    expect_final(stage.driver.run(agent), booked(script))
    stage.driver.restart(agent)
    expect_final(stage.driver.run(agent), booked(script))
    exactly_once(stage, script)


def run_killed(stage: Stage, agent: Agent, point: KillPoint, siblings: int = 0) -> None:
    """The agent in a process of its own, SIGKILLed at `point`."""
    (stage.workdir / "kill").write_text(point.value)
    if siblings:
        (stage.workdir / "siblings").write_text(str(siblings))
    try:
        # A driver whose framework has a venv of its own runs it there.
        command = getattr(stage.driver, "child_command", None)
        child = subprocess.run(
            command(agent)
            if command is not None
            else [
                sys.executable,
                "-m",
                "tests.adapters.child",
                stage.driver.name,
                spec_of(agent),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=CHILD_SECONDS,
            check=False,
            capture_output=True,
        )
    finally:
        (stage.workdir / "kill").unlink()
    if child.returncode != -9:
        raise AssertionError(
            f"the agent was not killed ({child.returncode}): {child.stderr.decode()}"
        )


def settle(stage: Stage, agent: Agent, out: Outcome) -> tuple[Outcome, dict[str, str]]:
    """The operator's part: every call paused for reconciliation is
    reconciled from the external counter (acted: as ran, with a found
    result; else as never ran), then the run resumed. Each pause must name
    every unsettled call of the run at once (checked by the caller)."""
    found: dict[str, str] = {}
    with Client(stage.target) as client:
        for _ in range(ROUNDS):
            waiting = [p for p in out.paused if p.kind is PauseKind.RECONCILE]
            if not waiting:
                return out, found
            acted = world.effects(stage.workdir)
            for p in waiting:
                call = client.get_tool_call(stage.run_id, p.call_id)
                expect(call.state is State.UNKNOWN, f"{p.call_id} is {call.state}")
                item = str(p.arguments["item"])
                ran = acted[item] > 0
                if ran:
                    found[p.call_id] = f"found {item}"
                client.reconcile(
                    stage.run_id,
                    p.call_id,
                    expected_revision=call.revision,
                    operator="olga",
                    reason="checked the counter",
                    evidence="effects file",
                    result=recorded(stage.driver, found.get(p.call_id)),
                    not_executed=not ran,
                    confirmed_dead_attempt=0 if ran else call.attempt,
                )
            out = stage.driver.run(agent)
    raise AssertionError(f"still paused after {ROUNDS} rounds: {out.paused}")


def recorded(driver: Driver, found: str | None) -> Any:
    """The result the operator records for a call found to have run, in the
    shape its adapter returns (a driver's `recorded_result`; else the text)."""
    shape = getattr(driver, "recorded_result", None)
    return found if found is None or shape is None else shape(found)


def results_after(script: Script, found: dict[str, str]) -> list[str]:
    return [found.get(c.call_id, world.result_text(c.item)) for t in script for c in t]


def killed_then_resumed(point: KillPoint) -> Callable[[Stage], None]:
    def scenario(stage: Stage) -> None:
        for shape in KILL_SHAPES:
            # Each shape its own run and work directory (its own counter:
            # the shapes book the same items).
            name = f"{len(shape)}{sum(shape)}"
            workdir = stage.workdir / f"shape-{name}"
            workdir.mkdir()
            sub = replace(stage, run_id=f"{stage.run_id}-{name}", workdir=workdir)
            one_kill(sub, world.script_of(*shape), point)

    return scenario


def one_kill(stage: Stage, script: Script, point: KillPoint) -> None:
    agent = stage.agent(script)
    stage.driver.restart(agent)
    run_killed(stage, agent, point)
    world.check_at_most_once(stage.workdir)
    out = stage.driver.run(agent)
    world.check_at_most_once(stage.workdir)
    if point is KillPoint.INSIDE and stage.wrapped:
        # Resumed again while unsettled: asked again, never replayed.
        expect(bool(out.paused), "an unknown outcome was not handed to reconciliation")
        out = stage.driver.run(agent)
        world.check_at_most_once(stage.workdir)
    out, found = settle(stage, agent, out)
    expect_final(out, results_after(script, found))
    exactly_once(stage, script)
    stage.driver.restart(agent)


def reconcile_siblings(stage: Stage) -> None:
    """Three parallel calls die together (the first acted, the others not):
    one pause names all three; reconciled as ran and as never ran, the
    resumed run gives the model the found result and runs the others once."""
    script = world.script_of(3)
    agent = stage.agent(script)
    run_killed(stage, agent, KillPoint.SIBLINGS, siblings=3)
    out = stage.driver.run(agent)
    world.check_at_most_once(stage.workdir)
    if stage.wrapped:
        named = sorted(p.call_id for p in out.paused if p.kind is PauseKind.RECONCILE)
        expect(named == ["c1", "c2", "c3"], f"one pause named {named}, not all 3")
    out, found = settle(stage, agent, out)
    expect(not stage.wrapped or found == {"c1": "found i1"}, f"found {found}")
    expect_final(out, results_after(script, found))
    exactly_once(stage, script)


def daemon_restart(stage: Stage) -> None:
    """The daemon SIGKILLed and started again between the model's turns:
    the run rides through; each call acts once."""
    script = world.script_of(1, 1)
    with restarting(stage.workdir / "data") as restarts:
        hook: dict[str, Any] = {}

        def before_turn(client: Any) -> Any:
            """Sync drivers call it; async ones await what it returns."""
            if "steps" not in hook:
                hook["steps"] = restarts.steps(client, at=2)
            if isinstance(client, AsyncClient):
                return hook["steps"].step()
            return hook["steps"]()

        agent = replace(stage.agent(script), target=restarts.target)
        agent = replace(agent, before_turn=before_turn)
        expect_final(stage.driver.run(agent), booked(script))
        expect(restarts.kills == 1, f"{restarts.kills} restarts")
    exactly_once(stage, script)


def approval(answer: Answer | None) -> Callable[[Stage], None]:
    def scenario(stage: Stage) -> None:
        script = world.script_of(1)
        agent = stage.agent(script, approval=True)
        out = stage.driver.run(agent)
        expect(world.effects(stage.workdir).total() == 0, "ran before any approval")
        [p] = out.paused
        expect(p.kind is PauseKind.APPROVAL, f"paused for {p.kind}")
        if answer is Answer.DECIDED_IN_EFFECTD:
            with Client(stage.target) as client:
                call = client.get_tool_call(stage.run_id, p.call_id)
                client.decide_approval(
                    stage.run_id,
                    p.call_id,
                    approve=True,
                    approver="ann",
                    reason="ok",
                    expected_revision=call.revision,
                    input_fingerprint=call.input_fingerprint,
                )
            expect_final(stage.driver.answer(agent, p, answer), booked(script))
            exactly_once(stage, script)
            return
        assert answer is not None
        again = stage.driver.answer(agent, p, answer)
        expect(world.effects(stage.workdir).total() == 0, f"{answer.value}: it ran")
        expect(
            [q.kind for q in again.paused] == [PauseKind.APPROVAL],
            f"{answer.value}: not asked again ({again})",
        )
        with Client(stage.target) as client:
            call = client.get_tool_call(stage.run_id, p.call_id)
        expect(call.state is State.AWAITING_APPROVAL, f"{call.state}")

    return scenario


def duplicate_step(stage: Stage) -> None:
    """The finished run's tool step run again the framework's way: the
    stored result, no execution."""
    script = world.script_of(1)
    agent = stage.agent(script)
    expect_final(stage.driver.run(agent), booked(script))
    expect_final(stage.driver.replay_step(agent), booked(script))
    exactly_once(stage, script)


SCENARIOS: dict[Scenario, Callable[[Stage], None]] = {
    Scenario.SINGLE: lambda s: run_and_rerun(s, world.script_of(1)),
    Scenario.PARALLEL_2: lambda s: run_and_rerun(s, world.script_of(2)),
    Scenario.PARALLEL_3: lambda s: run_and_rerun(s, world.script_of(3)),
    Scenario.KILL_BEFORE: killed_then_resumed(KillPoint.BEFORE),
    Scenario.KILL_INSIDE: killed_then_resumed(KillPoint.INSIDE),
    Scenario.KILL_AFTER: killed_then_resumed(KillPoint.AFTER),
    Scenario.KILL_AFTER_MODEL: killed_then_resumed(KillPoint.AFTER_MODEL),
    Scenario.DAEMON_RESTART: daemon_restart,
    Scenario.RECONCILE: reconcile_siblings,
    Scenario.APPROVAL_EFFECTD: approval(Answer.DECIDED_IN_EFFECTD),
    Scenario.APPROVAL_FRAMEWORK: approval(Answer.FRAMEWORK_ONLY),
    Scenario.APPROVAL_EDITED: approval(Answer.EDITED),
    Scenario.DUPLICATE_STEP: duplicate_step,
}
