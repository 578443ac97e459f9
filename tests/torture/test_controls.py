"""Negative controls of the torture test: a model with a planted bug must
be caught by the state machine's comparison against the same daemon, or the
comparison proves nothing. Two bugs are defects an outside audit found
(issue 15); the third reuses a deleted checkpoint's revision (ABA).

Each control drives the machine's own rules through a short sequence that
meets its bug, so it runs in seconds in `make test`; `make torture-deep`
also lets Hypothesis find each bug by random search
(`TORTURE_CONTROL_SEARCH`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis.stateful import run_state_machine_as_test

from tests.torture import model as m
from tests.torture.machine import TortureMachine, settings

REF = ("default", "r1", "c1")
A = m.Input("json", '{"a":1}', "A")


def _approval_flag(machine: TortureMachine) -> None:
    machine.prepare(
        ref=REF, tool="t1", effect=m.READ, given=A, channel="TOOL",
        approval=False, start=False, lease=0, retry=False,
    )  # fmt: skip
    machine.prepare_again(
        ref=REF, spelling=1, approval=True, start=False, lease=0, retry=False
    )


def _execute_without_attempt(machine: TortureMachine) -> None:
    machine.prepare(
        ref=REF, tool="t1", effect=m.READ, given=A, channel="TOOL",
        approval=False, start=True, lease=0, retry=False,
    )  # fmt: skip
    machine.report_unknown(ref=REF, skew=0)
    machine.prepare_again(
        ref=REF, spelling=0, approval=False, start=True, lease=0, retry=False
    )


def _revision_reused(machine: TortureMachine) -> None:
    machine.cp_put(ns="default", key="k1", value=b"v1", skew=None)
    machine.cp_delete(ns="default", key="k1", skew=0)
    machine.cp_put(ns="default", key="k1", value=b"v2", skew=None)


def _mcp_result(machine: TortureMachine) -> None:
    machine.prepare(
        ref=REF, tool="t1", effect=m.SIDE_EFFECT, given=A, channel="MCP",
        approval=False, start=True, lease=0, retry=False,
    )  # fmt: skip
    machine.report_unknown(ref=REF, skew=0)
    found = m.Result("OK", m.Input("json", '"charged"', "C"))
    machine.reconcile(ref=REF, rev=0, result=found, dead=None)
    call_tool_result = '{"content":[{"type":"text","text":"charged"}]}'
    found = m.Result("OK", m.Input("json", call_tool_result, "R3"))
    machine.reconcile(ref=REF, rev=0, result=found, dead=None)


SCRIPTS: dict[str, Callable[[TortureMachine], None]] = {
    "approval_flag_ignored_on_repeat": _approval_flag,
    "execute_without_attempt": _execute_without_attempt,
    "checkpoint_revision_reused": _revision_reused,
    "mcp_result_unchecked": _mcp_result,
}


def _planted(bug: str) -> type[TortureMachine]:
    class Planted(TortureMachine):
        bugs = m.Bugs(**{bug: True})

    return Planted


@pytest.mark.parametrize("bug", list(SCRIPTS))
def test_a_planted_bug_is_caught(bug: str) -> None:
    """The machine's comparison fails on the step where the model with the
    planted bug answers otherwise than the daemon; the same steps pass with
    the faithful model."""
    faithful = TortureMachine()
    try:
        SCRIPTS[bug](faithful)
    finally:
        faithful.teardown()
    planted = _planted(bug)()
    try:
        with pytest.raises(AssertionError, match="daemon"):
            SCRIPTS[bug](planted)
    finally:
        planted.teardown()


@pytest.mark.skipif(
    not os.environ.get("TORTURE_CONTROL_SEARCH"),
    reason="random search for the planted bugs runs in make torture-deep",
)
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("bug", list(SCRIPTS))
def test_random_operations_find_a_planted_bug(bug: str) -> None:
    """Hypothesis, drawing operations at random, finds each planted bug."""
    with pytest.raises(AssertionError, match="daemon"):
        run_state_machine_as_test(
            _planted(bug), settings=settings(1000, deep=False, shrink=False)
        )


def test_the_machine_reaches_a_tombstone_and_its_end() -> None:
    """A committed, acknowledged call past its window becomes a tombstone in
    both (a duplicate prepare refused alike), and is forgotten after the
    tombstone's lifetime: the retention steps compare something."""
    machine = TortureMachine()
    try:
        _execute_without_attempt(machine)  # STARTED, then UNKNOWN, READ
        machine.prepare_again(
            ref=REF, spelling=0, approval=False, start=True, lease=0, retry=True
        )
        result = m.Result("OK", m.Input("json", '{"r":1}', "R1"))
        machine.commit_held(ref=REF, result=result, acknowledge=True)
        machine.advance(seconds=8 * 86_400.0)
        machine.compact()
        assert REF in machine.model.tombstones
        machine.prepare_again(
            ref=REF, spelling=1, approval=False, start=False, lease=0, retry=False
        )
        machine.advance(seconds=31 * 86_400.0)
        machine.restart()
        assert REF not in machine.model.tombstones
        assert REF not in machine.model.calls
    finally:
        machine.teardown()


def test_a_refused_prepare_keeps_the_expired_lease_it_settled() -> None:
    """A READ whose lease ran out, asked again with `start` but no `retry`:
    the daemon settles the lease (UNKNOWN, "expire") and refuses the start
    INVALID_TRANSITION, keeping the settlement, as every request keeps the one
    it found; the model does the same (found by the random search: the model
    rolled the settlement back with the refusal and kept the call STARTED)."""
    machine = TortureMachine()
    try:
        machine.prepare(
            ref=REF, tool="t1", effect=m.READ, given=A, channel="TOOL",
            approval=False, start=True, lease=0, retry=False,
        )  # fmt: skip
        machine.advance(seconds=31.0)
        machine.prepare(
            ref=REF, tool="t1", effect=m.READ, given=A, channel="TOOL",
            approval=False, start=True, lease=0, retry=False,
        )  # fmt: skip
        assert machine.model.calls[REF].state == m.UNKNOWN
    finally:
        machine.teardown()


def test_a_refused_reconcile_leaves_the_expired_lease_as_the_operator_saw_it() -> None:
    """ "Never executed" of a call whose lease ran out a second ago is refused
    RECONCILE_QUARANTINE and changes nothing, not even the expiry
    (`ledger.operator_rules.reconcile`); the model agrees (found by the random
    search: the model kept the settlement)."""
    machine = TortureMachine()
    try:
        machine.prepare(
            ref=REF, tool="t1", effect=m.READ, given=A, channel="TOOL",
            approval=False, start=True, lease=0, retry=False,
        )  # fmt: skip
        machine.advance(seconds=31.0)
        machine.reconcile(ref=REF, rev=0, result=None, dead=None)
        assert machine.model.calls[REF].state == m.STARTED
    finally:
        machine.teardown()


def test_a_compacted_call_prepared_on_another_channel_is_result_compacted() -> None:
    """A compacted MCP call prepared again with the same tool, effect and
    input as a tool call: its tombstone keeps no channel (docs/contract.md
    §4.7), so the daemon answers RESULT_COMPACTED, and so does the model
    (found by the random search: the model compared the channel and said
    INPUT_MISMATCH)."""
    machine = TortureMachine()
    try:
        machine.prepare(
            ref=REF, tool="t1", effect=m.IDEMPOTENT_WRITE, given=A, channel="MCP",
            approval=False, start=True, lease=0, retry=False,
        )  # fmt: skip
        machine.commit_held(
            ref=REF, result=m.Result("OK", m.Input("json", '{"r":1}', "R1")),
            acknowledge=False,
        )  # fmt: skip
        machine.advance(seconds=31 * 24 * 3600.0)
        machine.compact()
        assert REF in machine.model.tombstones
        machine.prepare(
            ref=REF, tool="t1", effect=m.IDEMPOTENT_WRITE, given=A, channel="TOOL",
            approval=False, start=False, lease=0, retry=False,
        )  # fmt: skip
    finally:
        machine.teardown()
