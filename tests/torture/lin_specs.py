"""The sequential specifications the linearizability checker holds the
daemon's histories to.

`LedgerSpec`: one tool call's record, as the reference model (`model.py`)
moves it: each operation is applied to a model holding only that call, so
the ledger's rules are the model's, never rewritten here. A daemon restart
is an operation of every call (STARTED of an earlier incarnation becomes
UNKNOWN, contract §4.4). Leases are long enough never to lapse during a run.

`CheckpointSpec`: one checkpoint key as a versioned compare-and-swap
register. Revisions come from one counter of the store (checkpoints.proto),
so a key's next revision is not known in advance: a put answered OK names
it, and it must be above every revision the key had; a put whose outcome is
unknown leaves a value whose revision is known only to be higher, until a
read or a conflict names it. `revision_order` checks the counter across
keys: a write acknowledged before another was sent has the lower revision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.torture import model as m
from tests.torture.linearizability import Operation

# -- the ledger -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerOp:
    """`kind`: prepare, start, commit, report_unknown, decide_approval, get
    or restart. An approval sends the call's input fingerprint, or
    (`right_fingerprint` False) another."""

    kind: str
    ref: m.Ref | None = None
    prepare: m.Prepare | None = None
    expected_revision: int | None = None
    attempt: int = 0
    result: m.Result | None = None
    acknowledge: bool = False
    retry: bool = False
    lease_ms: int = 0
    approve: bool = False
    right_fingerprint: bool = False

    def __repr__(self) -> str:
        given = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("kind", "ref") and getattr(self, f.name) != f.default
        }
        if self.prepare is not None:
            p = self.prepare
            given["prepare"] = (
                f"{p.effect} approval={p.require_approval} start={p.start} "
                f"retry={p.retry}"
            )
        ref = self.ref[2] if self.ref else ""
        return f"{self.kind}({ref} {given})"


# A record as both sides show it: state, revision, attempt, the result's
# class (outcome, payload class, error code, message), acknowledged.
RecordView = tuple[str, int, int, tuple[str, str, str, str] | None, bool]
# The frozen fields of a model's call: everything but its history.
_FIELDS = tuple(
    f.name for f in dataclasses.fields(m.Call) if f.name not in ("history",)
)
# The model's incarnation, always: a restart moves every STARTED call to
# UNKNOWN, so no STARTED call is ever of an earlier one.
_INCARNATION = 1


def record_view(c: m.Call) -> RecordView:
    result = c.result.digest_class() if c.result is not None else None
    return (c.state, c.revision, c.attempt, result, c.acknowledged)


def _freeze(c: m.Call | None) -> Hashable:
    if c is None:
        return None
    values = [getattr(c, name) for name in _FIELDS]
    values[_FIELDS.index("reconciliations")] = tuple(c.reconciliations)
    values[_FIELDS.index("incarnation")] = _INCARNATION
    return tuple(values)


def _thaw(state: Any) -> m.Call:
    fields = dict(zip(_FIELDS, state, strict=True))
    fields["reconciliations"] = list(fields["reconciliations"])
    return m.Call(**fields)


def apply(model: m.Model, op: LedgerOp) -> Any:
    """The model's answer to `op` (the record's view beside an OK one)."""
    if op.kind == "restart":
        model.restart()
        return None
    assert op.ref is not None
    ref = op.ref
    answer: Any
    if op.kind == "prepare":
        assert op.prepare is not None
        answer = model.prepare(op.prepare)
    elif op.kind == "start":
        answer = model.start(ref, op.expected_revision, op.lease_ms, op.retry)
    elif op.kind == "commit":
        assert op.result is not None
        answer = model.commit(
            ref, op.attempt, op.result, op.expected_revision, op.acknowledge
        )
    elif op.kind == "report_unknown":
        answer = model.report_unknown(ref, op.attempt)
    elif op.kind == "decide_approval":
        answer = model.decide_approval(
            ref, op.approve, op.expected_revision or 0, op.right_fingerprint
        )
    else:
        found = model.get(ref)
        answer = found if isinstance(found, m.Err) else m.Ok(None)
    if isinstance(answer, m.Err):
        return (answer, None)
    return (answer, record_view(model.calls[ref]))


class LedgerSpec:
    """One call's record, moved by the reference model."""

    def init(self) -> Hashable:
        return None

    def partition(self, op: Operation) -> Hashable | None:
        given: LedgerOp = op.input
        return given.ref

    def step(self, state: Hashable, op: Operation) -> Sequence[Hashable]:
        model = m.Model()
        call = None if state is None else _thaw(state)
        if call is not None:
            model.calls[(call.ns, call.run, call.call)] = call
        answer = apply(model, op.input)
        model.incarnation = _INCARNATION
        if op.ret is not None and op.input.kind != "restart" and answer != op.output:
            return []
        # The model holds one call at most; a refused prepare restores a
        # copy of it (`model.transaction`), so it is read back.
        return [_freeze(next(iter(model.calls.values()), None))]


# -- checkpoints ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointOp:
    """`kind`: get, put or delete; `expected` None on a put: expect absent."""

    kind: str
    key: str
    expected: int | None = None
    value: bytes = b""


# (value or None when absent, revision or None when not yet known, floor):
# every revision the key gets from now on is above `floor`.
Register = tuple[bytes | None, int | None, int]


def _is(revision: int | None, floor: int, named: int) -> bool:
    """Whether a key at `revision` (None: unknown, above `floor`) may be at
    `named`."""
    return revision == named or (revision is None and named > floor)


class CheckpointSpec:
    """One key: a versioned compare-and-swap register."""

    def init(self) -> Register:
        return (None, 0, 0)

    def partition(self, op: Operation) -> Hashable | None:
        given: CheckpointOp = op.input
        return given.key

    def step(self, state: Register, op: Operation) -> Sequence[Register]:
        if op.input.kind == "get":
            return self._read(state, op)
        return self._write(state, op)

    def _read(self, state: Register, op: Operation) -> Sequence[Register]:
        value, revision, floor = state
        if op.ret is None:
            return [state]
        if op.output == ("absent",):
            return [state] if value is None else []
        _, seen, named = op.output
        if value is not None and seen == value and _is(revision, floor, named):
            return [(value, named, max(floor, named))]
        return []

    def _write(self, state: Register, op: Operation) -> Sequence[Register]:  # noqa: PLR0911 - one return per row
        value, revision, floor = state
        given: CheckpointOp = op.input
        present = value is not None
        wanted = given.expected
        if given.kind == "put" and wanted is None:
            applies, refused = not present, present
        else:
            assert wanted is not None
            applies = present and _is(revision, floor, wanted)
            refused = not present or revision != wanted
        # Every revision from now on is above the one the write expected.
        floor = max(floor, wanted or 0)
        written: Register = (None, 0, floor)
        if given.kind == "put":
            written = (given.value, None, floor)
        if op.ret is None:
            return ([written] if applies else []) + ([state] if refused else [])
        if op.output[0] == "ok":
            if not applies:
                return []
            if given.kind == "delete":
                return [written]
            named = op.output[1]
            return [(given.value, named, named)] if named > floor else []
        current = op.output[1]
        if not refused:
            return []
        if not present:
            return [state] if current == 0 else []
        if current == wanted or not _is(revision, state[2], current):
            return []
        return [(value, current, max(state[2], current))]


def revision_order(history: Sequence[Operation]) -> list[str]:
    """Writes answered OK whose revisions break the one counter: two with
    the same revision, or one acknowledged before another was sent with a
    revision not below it."""
    puts = [
        op
        for op in history
        if op.ret is not None and op.input.kind == "put" and op.output[0] == "ok"
    ]
    found: list[str] = []
    owners: dict[int, Operation] = {}
    for op in puts:
        other = owners.setdefault(op.output[1], op)
        if other is not op:
            found.append(f"revision {op.output[1]} given twice: {other} and {op}")
    by_return = sorted(puts, key=lambda op: op.ret or 0)
    highest: Operation | None = None
    index = 0
    for op in sorted(puts, key=lambda op: op.call):
        while index < len(by_return) and (by_return[index].ret or 0) < op.call:
            candidate = by_return[index]
            if highest is None or candidate.output[1] > highest.output[1]:
                highest = candidate
            index += 1
        if highest is not None and highest.output[1] >= op.output[1]:
            found.append(
                f"revision {op.output[1]} of {op.input!r} sent after "
                f"revision {highest.output[1]} of {highest.input!r} was answered"
            )
    return found
