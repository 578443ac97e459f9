"""What every driver's agent shares: the scenarios' names, the script of a
model's tool calls, the side-effect counter outside the agent's process, and
the kill points a tool or a scripted model obeys.

The counter is a file in the scenario's work directory: each side effect is
one line (`item`, pid), appended with O_APPEND and fsynced before the tool
goes on, so a SIGKILL right after it cannot lose it; the test process reads
it. A kill point is a file `kill` in the work directory naming where the
agent's process SIGKILLs itself (`KillPoint`); only agent subprocesses are
given one.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# The most a held tool waits for its siblings before it gives up.
HOLD_SECONDS = 60.0


class Scenario(enum.Enum):
    SINGLE = "single call"
    PARALLEL_2 = "2 parallel calls"
    PARALLEL_3 = "3 parallel calls"
    KILL_BEFORE = "kill before effect"
    KILL_INSIDE = "kill inside effect"
    KILL_AFTER = "kill after effect"
    KILL_AFTER_MODEL = "kill after model saw it"
    DAEMON_RESTART = "daemon restart"
    RECONCILE = "reconcile siblings"
    APPROVAL_EFFECTD = "approval in effectd"
    APPROVAL_FRAMEWORK = "approval in framework only"
    APPROVAL_EDITED = "approval of edited args"
    DUPLICATE_STEP = "duplicate finished step"


class KillPoint(enum.Enum):
    """Where an agent process dies (the `kill` file's content)."""

    BEFORE = "before"  # the tool is called, nothing acted yet
    INSIDE = "inside"  # the tool acted, nothing recorded its result
    AFTER = "after"  # the framework asks the model again, result in hand
    AFTER_MODEL = "after-model"  # the model read the result and answered
    # Reconcile: the first call acts, every call holds until all are in their
    # tool, then the process dies (the others never acted).
    SIBLINGS = "siblings"


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call of the model: `book(item)` with the model's id."""

    call_id: str
    item: str


# A model response: the calls it makes together (parallel calls).
Script = tuple[tuple[Call, ...], ...]


def script_of(*turns: int) -> Script:
    """Turns of `n` parallel calls each: c1, c2, ... booking i1, i2, ..."""
    out, k = [], 0
    for n in turns:
        calls = []
        for _ in range(n):
            k += 1
            calls.append(Call(f"c{k}", f"i{k}"))
        out.append(tuple(calls))
    return tuple(out)


def result_text(item: str) -> str:
    """What `book(item)` returns: the model sees this (or a reconciled one)."""
    return f"booked {item}"


def final_text(results: list[str]) -> str:
    """The scripted model's last answer: every tool result it saw, in order."""
    return "done: " + " | ".join(results)


def kill_point(workdir: Path) -> KillPoint | None:
    path = workdir / "kill"
    return KillPoint(path.read_text().strip()) if path.exists() else None


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def book(workdir: Path, item: str) -> str:
    """The tool's body, shared by every driver: one side effect on the
    external counter, with the scenario's kill points around it."""
    point = kill_point(workdir)
    if point is KillPoint.BEFORE:
        die()
    if point is KillPoint.SIBLINGS:
        return _siblings(workdir, item)
    _append(workdir / "effects", {"item": item, "pid": os.getpid()})
    if point is KillPoint.INSIDE:
        die()
    return result_text(item)


def _siblings(workdir: Path, item: str) -> str:
    first = item == "i1"
    if first:
        _append(workdir / "effects", {"item": item, "pid": os.getpid()})
    (workdir / f"in-{item}").touch()
    want = int((workdir / "siblings").read_text())
    end = time.monotonic() + HOLD_SECONDS
    while len(list(workdir.glob("in-*"))) < want:
        if time.monotonic() > end:
            raise TimeoutError("the siblings never all reached the tool")
        time.sleep(0.01)
    if first:
        die()
    time.sleep(HOLD_SECONDS)  # the first call kills the process meanwhile
    raise TimeoutError("not killed")


def model_turn(workdir: Path, turn: int, *, answered: bool) -> None:
    """The scripted model's hook: called at a turn's start and once it has
    its answer; a turn after the first has tool results in hand."""
    point = kill_point(workdir)
    if turn == 0:
        return
    if point is KillPoint.AFTER and not answered:
        die()
    if point is KillPoint.AFTER_MODEL and answered:
        die()


def _append(path: Path, entry: dict[str, object]) -> None:
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def effects(workdir: Path) -> Counter[str]:
    """How often each item was booked, as the external counter holds it."""
    path = workdir / "effects"
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["item"] for line in path.read_text().splitlines())


class PropertyBroken(AssertionError):
    """A scenario's property broke (what a negative control must raise)."""


class DuplicateEffect(PropertyBroken):
    """A side effect happened more than once."""


def check_at_most_once(workdir: Path) -> Counter[str]:
    """The suite's property: each item booked at most once."""
    counted = effects(workdir)
    twice = {item: n for item, n in counted.items() if n > 1}
    if twice:
        raise DuplicateEffect(f"side effects repeated: {twice}")
    return counted
