"""Named failpoints: places in the stores' write paths where a test build of
the daemon crashes on purpose, to prove what a crash at each of them leaves.

A store is given a `Failpoints` (its options' `failpoints`); None, the
production value, costs one attribute test per batch. Armed, each entry of
`EFFECTD_FAILPOINTS` (`point[@Method][:count]`, comma-separated) crashes the
process at the `count`-th time (1 by default) `point` is reached by a batch
holding a write of an RPC whose method ends in `/Method` (any write without
`@Method`): one line on stderr, then `os._exit(CRASH_EXIT)`, as sudden as
kill -9 (no buffer flushed, no handler run, nothing committed after).

Only a test build arms them (`tests/support/failpoint_daemon.py`); the
shipped program refuses to start while `EFFECTD_FAILPOINTS` is set
(`sidecar.cli`), so a stray variable can neither crash a production daemon
nor be silently ignored.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

ENV = "EFFECTD_FAILPOINTS"
# What the process exits with at a failpoint: a test tells it from a kill.
CRASH_EXIT = 86


class Point(enum.Enum):
    """Where in a batch's write the process can be crashed. The same points
    in both stores (`lmdb.` and `pg.` name which)."""

    # The batch is taken, its transaction begun; nothing applied yet.
    LMDB_BEFORE_APPLY = "lmdb.before_apply"
    # Some of the batch's requests are applied in the transaction, not all.
    LMDB_MID_BATCH = "lmdb.mid_batch"
    # Every request applied, the commit (and its fsync) not yet made.
    LMDB_BEFORE_COMMIT = "lmdb.before_commit"
    # Committed and durable; no request answered yet.
    LMDB_AFTER_COMMIT = "lmdb.after_commit"
    PG_BEFORE_APPLY = "pg.before_apply"
    PG_MID_BATCH = "pg.mid_batch"
    # Every request applied and flushed; COMMIT not yet sent. A call's save
    # alone in its batch, one statement committed on its own, reaches this
    # point and PG_BEFORE_APPLY before it is sent.
    PG_BEFORE_COMMIT = "pg.before_commit"
    # COMMIT returned; no request answered yet.
    PG_AFTER_COMMIT = "pg.after_commit"


class FailpointError(ValueError):
    """`EFFECTD_FAILPOINTS` does not parse."""


@dataclass(slots=True)
class _Armed:
    point: Point
    method: str
    # Hits left before it fires.
    left: int


class Scoped:
    """A write function tagged with the method of the RPC that wrote it."""

    __slots__ = ("fn", "scope")

    def __init__(self, fn: Callable[[Any], Any], scope: str) -> None:
        self.fn = fn
        self.scope = scope

    def __call__(self, view: Any) -> Any:
        return self.fn(view)


class Failpoints:
    """The armed failpoints of one daemon.

    Args:
        spec: entries `point[@Method][:count]`, comma-separated.
        scope: the method of the RPC being served ("" outside one), read
            when a write is queued.
        crash: what firing does (a test's fake; default: exit at once).
    """

    def __init__(
        self,
        spec: str,
        scope: Callable[[], str] = lambda: "",
        crash: Callable[[str], None] | None = None,
    ) -> None:
        self._armed = [_parse(entry) for entry in spec.split(",") if entry.strip()]
        if not self._armed:
            raise FailpointError(f"{ENV} names no failpoint")
        self._scope = scope
        self._crash = crash or _exit
        self._lock = threading.Lock()

    def tag(self, fn: Callable[[Any], Any]) -> Scoped:
        """`fn`, tagged with the method of the RPC queuing it."""
        return Scoped(fn, self._scope())

    def reached(self, point: Point, fns: Iterable[object]) -> None:
        """Counts a hit of `point` by a batch of the write functions `fns`;
        crashes when an armed entry's count runs out."""
        scopes: list[str] | None = None
        with self._lock:
            for armed in self._armed:
                if armed.point is not point or armed.left <= 0:
                    continue
                if armed.method:
                    if scopes is None:
                        scopes = [getattr(fn, "scope", "") for fn in fns]
                    if not any(s.endswith("/" + armed.method) for s in scopes):
                        continue
                armed.left -= 1
                if armed.left == 0:
                    self._crash(f"{point.value}@{armed.method or '*'}")
                    return


def _parse(entry: str) -> _Armed:
    text = entry.strip()
    name, _, count = text.partition(":")
    name, _, method = name.partition("@")
    try:
        point = Point(name)
    except ValueError:
        known = ", ".join(p.value for p in Point)
        raise FailpointError(
            f"{ENV}: unknown failpoint {name!r} (known: {known})"
        ) from None
    if count and not (count.isdigit() and int(count) >= 1):
        raise FailpointError(f"{ENV}: {text!r}: the count must be a number >= 1")
    return _Armed(point, method, int(count) if count else 1)


def _exit(where: str) -> None:
    # Straight to the descriptor: no Python buffer survives os._exit.
    os.write(2, f"effectd: failpoint {where} reached: crashing\n".encode())
    os._exit(CRASH_EXIT)
