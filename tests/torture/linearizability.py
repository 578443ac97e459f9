"""A linearizability checker: the depth-first search of Wing and Gong with
Lowe's memoization of (operations linearized, model state), the algorithm
Knossos and Porcupine implement, written here from the algorithm.

A history is a list of `Operation`s, each with the time its client invoked
it and the time its answer came back. An operation whose outcome is unknown
(a deadline passed, the connection was lost) has no return time: it may
have taken effect at any moment after its call, or never, so it stays
concurrent with everything after it (Jepsen's `:info`, Porcupine's return
event appended at the end). The history is linearizable when the operations
can be put in one order that respects real time (an operation that returned
before another was invoked comes first) and in which a sequential
specification, the `Spec`, gives every known answer.

The search is split by `Spec.partition` (P-compositionality: each key of a
key/value store is checked on its own) and stays bounded: a partition longer
than `max_ops`, or whose search explores more than `max_nodes` states or
runs longer than `max_seconds`, is answered UNDECIDED, never a hang.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

S = TypeVar("S", bound=Hashable)
# Later than any real return: an unknown outcome's return time.
NEVER = 1 << 62


@dataclass(frozen=True, slots=True)
class Operation:
    """One client operation. `ret` None: its outcome is unknown, and its
    `output` means nothing."""

    client: int
    call: int
    ret: int | None
    input: Any
    output: Any = None

    @property
    def unknown(self) -> bool:
        return self.ret is None


class Spec(Protocol[S]):
    """A sequential specification."""

    def init(self) -> S:
        """The state before the first operation."""
        ...

    def step(self, state: S, op: Operation) -> Sequence[S]:
        """The states `op` may leave when applied to `state` alone: empty
        when its known output is not what the specification answers; more
        than one when it is undetermined (an unknown outcome)."""
        ...

    def partition(self, op: Operation) -> Hashable | None:
        """The key whose history `op` belongs to; None: every key's."""
        ...


class Result(enum.Enum):
    LINEARIZABLE = "linearizable"
    ILLEGAL = "illegal"
    UNDECIDED = "undecided"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for one partition. `explanation` of an ILLEGAL history:
    the longest order found, and the operations none of which could come
    next; of an UNDECIDED one: which bound stopped the search."""

    key: Hashable
    result: Result
    operations: int
    unknown: int
    explored: int
    explanation: str = ""


@dataclass(frozen=True, slots=True)
class Bounds:
    max_ops: int = 200
    max_nodes: int = 200_000
    max_seconds: float = 20.0


@dataclass(slots=True)
class _Search(Generic[S]):
    spec: Spec[S]
    ops: list[Operation]
    bounds: Bounds
    explored: int = 0
    deepest: int = -1
    deepest_at: tuple[int, Any] = (0, None)
    seen: set[tuple[int, S]] = field(default_factory=set)

    def candidates(self, done: int) -> Iterator[int]:
        """The operations that may come next: every pending one invoked
        before the earliest return among the pending ones (the calls are in
        order, so they are a prefix of the pending ones)."""
        horizon = NEVER
        for i, op in enumerate(self.ops):
            if not done >> i & 1 and op.ret is not None and op.ret < horizon:
                horizon = op.ret
        for i, op in enumerate(self.ops):
            if op.call > horizon:
                return
            if not done >> i & 1:
                yield i

    def run(self, key: Hashable) -> Verdict:
        n = len(self.ops)
        unknown = sum(op.unknown for op in self.ops)
        if n > self.bounds.max_ops:
            return Verdict(
                key, Result.UNDECIDED, n, unknown, 0,
                f"{n} operations, over the bound of {self.bounds.max_ops}",
            )  # fmt: skip
        if n == 0:
            return Verdict(key, Result.LINEARIZABLE, 0, 0, 0)
        full = (1 << n) - 1
        stop_at = time.monotonic() + self.bounds.max_seconds
        start = self.spec.init()
        # Each frame: the linearized set, the state, and the moves left.
        stack = [(0, start, self._moves(0, start))]
        self.seen.add((0, start))
        while stack:
            _, _, moves = stack[-1]
            move = next(moves, None)
            if move is None:
                stack.pop()
                continue
            after, state = move
            if after == full:
                return Verdict(key, Result.LINEARIZABLE, n, unknown, self.explored)
            if (after, state) in self.seen:
                continue
            self.seen.add((after, state))
            self.explored += 1
            if self.explored > self.bounds.max_nodes or (
                self.explored % 1024 == 0 and time.monotonic() > stop_at
            ):
                return Verdict(
                    key, Result.UNDECIDED, n, unknown, self.explored,
                    f"search stopped after {self.explored} states "
                    f"(bounds: {self.bounds.max_nodes} states, "
                    f"{self.bounds.max_seconds} s)",
                )  # fmt: skip
            depth = after.bit_count()
            if depth > self.deepest:
                self.deepest, self.deepest_at = depth, (after, state)
            stack.append((after, state, self._moves(after, state)))
        return Verdict(key, Result.ILLEGAL, n, unknown, self.explored, self._explain())

    def _moves(self, done: int, state: S) -> Iterator[tuple[int, S]]:
        for i in self.candidates(done):
            for after in self.spec.step(state, self.ops[i]):
                yield done | 1 << i, after

    def _explain(self) -> str:
        done, state = self.deepest_at
        if self.deepest < 0:
            done, state = 0, self.spec.init()
        blocked = [self.ops[i] for i in self.candidates(done)]
        return (
            f"at most {max(self.deepest, 0)} of {len(self.ops)} operations "
            f"linearize; in state {state!r} none of these may come next: "
            + "; ".join(describe(op) for op in blocked)
        )


def describe(op: Operation) -> str:
    ret = "unknown" if op.ret is None else f"{op.ret}"
    out = "?" if op.ret is None else repr(op.output)
    return f"client {op.client} [{op.call}, {ret}] {op.input!r} -> {out}"


def check_partition(
    spec: Spec[S],
    ops: Sequence[Operation],
    key: Hashable = None,
    bounds: Bounds = Bounds(),
) -> Verdict:
    """One partition's history, searched whole."""
    ordered = sorted(ops, key=lambda op: (op.call, op.ret is None, op.ret or 0))
    return _Search(spec, ordered, bounds).run(key)


def partitions(
    spec: Spec[S], history: Sequence[Operation]
) -> dict[Hashable, list[Operation]]:
    """The history split by key; an operation of every key (a restart)
    joins a key's history only when it falls between the key's first call
    and its last known return, where it can change what is seen."""
    shared: list[Operation] = []
    keyed: dict[Hashable, list[Operation]] = {}
    for op in history:
        key = spec.partition(op)
        if key is None:
            shared.append(op)
        else:
            keyed.setdefault(key, []).append(op)
    for ops in keyed.values():
        first = min(op.call for op in ops)
        last = max((op.ret for op in ops if op.ret is not None), default=first)
        ops.extend(op for op in shared if op.call < last and (op.ret or NEVER) > first)
    return keyed


def check(
    spec: Spec[S], history: Sequence[Operation], bounds: Bounds = Bounds()
) -> list[Verdict]:
    """Every partition's verdict."""
    return [
        check_partition(spec, ops, key, bounds)
        for key, ops in partitions(spec, history).items()
    ]
