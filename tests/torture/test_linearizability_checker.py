"""The linearizability checker on small hand-written histories whose verdict
is known, and against an exhaustive search on random small ones: it must
reject every history that is not linearizable (else the daemon's histories
prove nothing) and accept every one that is.

The module is long on purpose (over 400 lines): it is tables of histories,
each row an operation with its times and answer, read against its verdict.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.torture import model as m
from tests.torture.lin_specs import (
    CheckpointOp,
    CheckpointSpec,
    LedgerOp,
    LedgerSpec,
    revision_order,
)
from tests.torture.linearizability import (
    Bounds,
    Operation,
    Result,
    Spec,
    check,
    check_partition,
    partitions,
)

K = "k1"


def put(  # noqa: PLR0917 - one row of a history
    client: int,
    call: int,
    ret: int | None,
    expected: int | None,
    value: bytes,
    output: tuple[object, ...] | None = None,
) -> Operation:
    return Operation(client, call, ret, CheckpointOp("put", K, expected, value), output)


def get(client: int, call: int, ret: int, output: tuple[object, ...]) -> Operation:
    return Operation(client, call, ret, CheckpointOp("get", K), output)


def delete(
    client: int,
    call: int,
    ret: int | None,
    expected: int,
    output: tuple[object, ...] | None = None,
) -> Operation:
    return Operation(client, call, ret, CheckpointOp("delete", K, expected), output)


def verdict(history: list[Operation], spec: Spec[Any] | None = None) -> Result:
    chosen: Spec[Any] = spec or CheckpointSpec()
    verdicts = check(chosen, history)
    results = {v.result for v in verdicts}
    assert len(verdicts) == 1 or not history
    return results.pop() if results else Result.LINEARIZABLE


LINEARIZABLE = {
    "sequential writes and reads": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        get(2, 2, 3, ("value", b"a", 5)),
        put(1, 4, 5, 5, b"b", ("ok", 9)),
        get(2, 6, 7, ("value", b"b", 9)),
    ],
    "a read concurrent with a write sees the old value": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, 6, 5, b"b", ("ok", 6)),
        get(2, 3, 4, ("value", b"a", 5)),
    ],
    "a read concurrent with a write sees the new value, the next the new too": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, 6, 5, b"b", ("ok", 6)),
        get(2, 3, 4, ("value", b"b", 6)),
        get(2, 5, 7, ("value", b"b", 6)),
    ],
    "two CAS from one revision: one wins, one conflicts": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, 5, 5, b"b", ("conflict", 7)),
        put(2, 3, 4, 5, b"c", ("ok", 7)),
    ],
    "an unknown CAS that took effect": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, None, 5, b"b"),
        get(2, 10, 11, ("value", b"b", 8)),
        put(2, 12, 13, 8, b"c", ("ok", 9)),
    ],
    "an unknown CAS that never took effect": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, None, 5, b"b"),
        get(2, 10, 11, ("value", b"a", 5)),
    ],
    "an unknown CAS named by a later conflict": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, None, 5, b"b"),
        put(2, 10, 11, 5, b"c", ("conflict", 8)),
        get(2, 12, 13, ("value", b"b", 8)),
    ],
    "delete, then a new revision above the deleted one": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        delete(1, 2, 3, 5, ("ok",)),
        get(2, 4, 5, ("absent",)),
        put(2, 6, 7, None, b"b", ("ok", 6)),
    ],
}

ILLEGAL = {
    "two acknowledged CAS from one revision": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, 5, 5, b"b", ("ok", 6)),
        put(2, 3, 4, 5, b"c", ("ok", 7)),
    ],
    "a stale read after an acknowledged write": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, 3, 5, b"b", ("ok", 6)),
        get(2, 4, 5, ("value", b"a", 5)),
    ],
    "a read that goes back": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, 9, 5, b"b", ("ok", 6)),
        get(2, 3, 4, ("value", b"b", 6)),
        get(3, 5, 6, ("value", b"a", 5)),
    ],
    "a revision that goes back": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, 3, 5, b"b", ("ok", 4)),
    ],
    "a deleted revision given again (ABA)": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        delete(1, 2, 3, 5, ("ok",)),
        put(2, 4, 5, None, b"b", ("ok", 5)),
    ],
    "an unknown write seen, then unseen": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(1, 2, None, 5, b"b"),
        get(2, 10, 11, ("value", b"b", 8)),
        get(2, 12, 13, ("value", b"a", 5)),
    ],
    "a value read before the unknown write of it was sent": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        get(2, 2, 3, ("value", b"b", 8)),
        put(1, 4, None, 5, b"b"),
    ],
    "a conflict that names a revision never written": [
        put(1, 0, 1, None, b"a", ("ok", 5)),
        put(2, 2, 3, 4, b"b", ("conflict", 7)),
    ],
}


@pytest.mark.parametrize("name", list(LINEARIZABLE))
def test_a_linearizable_history_is_accepted(name: str) -> None:
    assert verdict(LINEARIZABLE[name]) is Result.LINEARIZABLE


@pytest.mark.parametrize("name", list(ILLEGAL))
def test_a_history_that_is_not_linearizable_is_rejected(name: str) -> None:
    assert verdict(ILLEGAL[name]) is Result.ILLEGAL


def test_a_rejection_names_the_operations_that_cannot_come_next() -> None:
    (found,) = check(
        CheckpointSpec(), ILLEGAL["a stale read after an acknowledged write"]
    )
    assert "at most 2 of 3" in found.explanation
    assert "b'a'" in found.explanation


def test_keys_are_checked_apart() -> None:
    other = Operation(9, 0, 1, CheckpointOp("get", "k2"), ("absent",))
    verdicts = check(
        CheckpointSpec(), [*ILLEGAL["a stale read after an acknowledged write"], other]
    )
    assert {v.key: v.result for v in verdicts} == {
        K: Result.ILLEGAL,
        "k2": Result.LINEARIZABLE,
    }


def test_a_bounded_search_answers_undecided() -> None:
    """Many unknown writes and a read none of them explains: the search
    stops at its bound and says so, rather than run for long."""
    history = [put(1, 0, 1, None, b"a", ("ok", 5))]
    history += [put(i, 2 + i, None, 5, bytes([i])) for i in range(2, 30)]
    history.append(get(1, 100, 101, ("value", b"zz", 9)))
    (found,) = check(CheckpointSpec(), history, Bounds(max_nodes=2000))
    assert found.result is Result.UNDECIDED
    assert "2000 states" in found.explanation
    (capped,) = check(CheckpointSpec(), history, Bounds(max_ops=10))
    assert capped.result is Result.UNDECIDED


def test_the_revision_counter_is_checked_across_keys() -> None:
    first = put(1, 0, 1, None, b"a", ("ok", 5))
    later = Operation(2, 2, 3, CheckpointOp("put", "k2", None, b"b"), ("ok", 4))
    concurrent = Operation(2, 0, 3, CheckpointOp("put", "k2", None, b"b"), ("ok", 4))
    assert revision_order([first, later])
    assert not revision_order([first, concurrent])
    assert revision_order([first, Operation(2, 0, 3, later.input, ("ok", 5))])


# -- the ledger ------------------------------------------------------------------

REF = ("default", "run", "c1")
PREPARE = m.Prepare(*REF, "t1", m.IDEMPOTENT_WRITE, m.Input("json", '{"a":1}', "A"))
HELD = m.Ok(
    {
        "decision": "EXECUTE",
        "key": "run:c1",
        "held": True,
        "retry_required": False,
        "ref": REF,
    }
)
IN_PROGRESS = m.Ok(
    {
        "decision": "IN_PROGRESS",
        "key": "run:c1",
        "held": False,
        "retry_required": False,
        "ref": REF,
    }
)
R1 = m.Result("OK", m.Input("json", '{"r":1}', "R1"))
R2 = m.Result("OK", m.Input("json", '{"r":2}', "R2"))


def ledger(
    client: int, call: int, ret: int | None, op: LedgerOp, output: object = None
) -> Operation:
    return Operation(client, call, ret, op, output)


def prepare_start(
    client: int, call: int, ret: int | None, output: object = None
) -> Operation:
    op = LedgerOp("prepare", REF, prepare=dataclasses.replace(PREPARE, start=True))
    return ledger(client, call, ret, op, output)


def record(
    state: str,
    revision: int,
    attempt: int,
    result: m.Result | None = None,
    acknowledged: bool = False,
) -> object:
    return (
        state,
        revision,
        attempt,
        result.digest_class() if result else None,
        acknowledged,
    )


def commit(
    client: int, call: int, ret: int | None, result: m.Result, output: object = None
) -> Operation:
    return ledger(
        client, call, ret, LedgerOp("commit", REF, attempt=1, result=result), output
    )


def read(client: int, call: int, ret: int, output: object) -> Operation:
    return ledger(client, call, ret, LedgerOp("get", REF), output)


RESTART = ledger(0, 20, 30, LedgerOp("restart"))
STARTED = record(m.STARTED, 2, 1)
UNKNOWN_VIEW = record(m.UNKNOWN, 3, 1)

LEDGER_CASES: dict[str, tuple[Result, list[Operation]]] = {
    "one of two concurrent prepares holds the attempt": (
        Result.LINEARIZABLE,
        [
            prepare_start(1, 0, 5, (HELD, STARTED)),
            prepare_start(2, 1, 4, (IN_PROGRESS, STARTED)),
        ],
    ),
    "both concurrent prepares hold the attempt": (
        Result.ILLEGAL,
        [
            prepare_start(1, 0, 5, (HELD, STARTED)),
            prepare_start(2, 1, 4, (HELD, STARTED)),
        ],
    ),
    "two different results both committed": (
        Result.ILLEGAL,
        [
            prepare_start(1, 0, 1, (HELD, STARTED)),
            commit(1, 2, 6, R1, (m.Ok(None), record(m.COMMITTED, 3, 1, R1))),
            commit(2, 3, 5, R2, (m.Ok(None), record(m.COMMITTED, 3, 1, R2))),
        ],
    ),
    "an unknown commit, then its result read": (
        Result.LINEARIZABLE,
        [
            prepare_start(1, 0, 1, (HELD, STARTED)),
            commit(1, 2, None, R1),
            read(2, 8, 9, (m.Ok(None), record(m.COMMITTED, 3, 1, R1))),
        ],
    ),
    "a restart makes a started call UNKNOWN": (
        Result.LINEARIZABLE,
        [
            prepare_start(1, 0, 1, (HELD, STARTED)),
            RESTART,
            read(2, 40, 41, (m.Ok(None), UNKNOWN_VIEW)),
        ],
    ),
    "a call still STARTED after a restart": (
        Result.ILLEGAL,
        [
            prepare_start(1, 0, 1, (HELD, STARTED)),
            RESTART,
            read(2, 40, 41, (m.Ok(None), STARTED)),
        ],
    ),
    "an unknown start before a restart, then UNKNOWN read": (
        Result.LINEARIZABLE,
        [
            ledger(
                1,
                0,
                1,
                LedgerOp("prepare", REF, prepare=PREPARE),
                (m.Ok({**HELD.value, "held": False}), record(m.PREPARED, 1, 0)),
            ),
            ledger(1, 2, None, LedgerOp("start", REF, lease_ms=600_000)),
            RESTART,
            read(2, 40, 41, (m.Ok(None), UNKNOWN_VIEW)),
        ],
    ),
}


@pytest.mark.parametrize("name", list(LEDGER_CASES))
def test_ledger_histories(name: str) -> None:
    expected, history = LEDGER_CASES[name]
    assert verdict(history, LedgerSpec()) is expected


def test_a_restart_joins_only_the_histories_it_can_change() -> None:
    """A restart before a call's first operation, or after its last answer,
    is left out of its history; one in between is in it."""
    first = prepare_start(1, 100, 110, (HELD, STARTED))
    seen = read(2, 200, 210, (m.Ok(None), UNKNOWN_VIEW))
    before = ledger(0, 10, 20, LedgerOp("restart"))
    between = ledger(0, 150, 160, LedgerOp("restart"))
    after = ledger(0, 300, 310, LedgerOp("restart"))
    (ops,) = partitions(LedgerSpec(), [before, first, between, seen, after]).values()
    assert sorted(ops, key=lambda op: op.call) == [first, between, seen]


# -- the search against every order ---------------------------------------------


def brute_force(spec: Spec[Any], ops: Sequence[Operation]) -> bool:
    """Linearizable by trying every order that respects real time."""
    for order in itertools.permutations(ops):
        if any(
            b.ret is not None and b.ret < a.call
            for i, a in enumerate(order)
            for b in order[i + 1 :]
        ):
            continue
        states: list[Any] = [spec.init()]
        for op in order:
            states = [after for s in states for after in spec.step(s, op)]
        if states:
            return True
    return False


@st.composite
def small_histories(draw: st.DrawFn) -> list[Operation]:
    ops: list[Operation] = []
    for client in range(draw(st.integers(1, 5))):
        call = draw(st.integers(0, 6))
        length = draw(st.integers(0, 4))
        ret = None if draw(st.integers(0, 4)) == 0 else call + length
        kind = draw(st.sampled_from(("get", "put", "put", "delete")))
        expected = draw(st.sampled_from((None, 1, 2, 3)))
        if kind == "get":
            output: tuple[object, ...] = draw(
                st.sampled_from(
                    (
                        ("absent",),
                        ("value", b"a", 1),
                        ("value", b"b", 2),
                        ("value", b"b", 3),
                    )
                )
            )
            ret = call + length
        elif kind == "put":
            output = draw(
                st.sampled_from(
                    (
                        ("ok", 1),
                        ("ok", 2),
                        ("ok", 3),
                        ("conflict", 0),
                        ("conflict", 1),
                        ("conflict", 2),
                    )
                )
            )
        else:
            expected = expected or 1
            output = draw(st.sampled_from((("ok",), ("conflict", 0), ("conflict", 2))))
        value = draw(st.sampled_from((b"a", b"b")))
        ops.append(
            Operation(client, call, ret, CheckpointOp(kind, K, expected, value), output)
        )
    return ops


@settings(max_examples=300, deadline=None)
@given(small_histories())
def test_the_search_agrees_with_every_order(history: list[Operation]) -> None:
    """On random histories of up to five operations, the memoized search
    and the exhaustive one give the same verdict."""
    found = check_partition(CheckpointSpec(), history)
    assert (found.result is Result.LINEARIZABLE) == brute_force(
        CheckpointSpec(), history
    )
