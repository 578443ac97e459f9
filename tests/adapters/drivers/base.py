"""The driver interface: what the conformance suite asks of an adapter.

A driver builds an agent the framework's own way: a scripted model (its
n-th response is the script's n-th turn of parallel `book` calls, then a
final text listing every tool result it saw, `world.final_text`), and the
tool `book` (`world.book`: the side effect on the external counter) either
wrapped by the adapter or, for the negative controls, unwrapped. Its state
between runs (checkpoints, message history) lives in the scenario's work
directory, so that a run started in one process is resumed in another.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tests.adapters.world import Scenario, Script


class PauseKind(enum.Enum):
    APPROVAL = "approval"
    RECONCILE = "reconcile"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Paused:
    """One call the run stopped on, as the framework shows it."""

    call_id: str
    kind: PauseKind
    arguments: Mapping[str, Any]
    # The framework's own value for it (an interrupt's value, an approval
    # item), handed back to the driver's `answer`.
    raw: Any = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run (or a resume) ended."""

    # Every call the run is stopped on, all at once.
    paused: tuple[Paused, ...] = ()
    # The model's last text ("" when paused).
    final: str = ""


class Answer(enum.Enum):
    """A human's answer to an approval pause."""

    # Already decided in effectd (`decide_approval`): resume as is.
    DECIDED_IN_EFFECTD = "decided in effectd"
    # The framework's own "approved", never recorded in effectd.
    FRAMEWORK_ONLY = "framework only"
    # Approved through the adapter, but with the shown arguments edited.
    EDITED = "edited"


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent: its daemon, its run and its work directory."""

    target: str
    workdir: Path
    run_id: str
    script: Script
    # The adapter's wrapper around `book`; False: the bare tool (control).
    wrapped: bool = True
    # `book` requires an approval (the adapter's policy).
    approval: bool = False
    # Called with the driver's effectd client before each model turn (the
    # daemon-restart scenario's hook), from the model's own code; an async
    # driver awaits what it returns for an AsyncClient. None: nothing.
    before_turn: Callable[[Any], Any] | None = field(default=None, compare=False)


class Driver(Protocol):
    """An adapter under the suite. `not_applicable` names the scenarios the
    framework cannot do by its design, each with the reason (reported, never
    skipped silently)."""

    name: str
    not_applicable: Mapping[Scenario, str]

    def run(self, agent: Agent) -> Outcome:
        """Starts the run, or resumes it from its saved state (after a kill,
        after a pause an operator settled in effectd)."""

    def restart(self, agent: Agent) -> None:
        """Forgets the framework's saved state: the next `run` starts the run
        from the beginning, as a retried job would."""

    def replay_step(self, agent: Agent) -> Outcome:
        """Runs the finished run's (first) tool step again, the framework's
        own way of re-running a step (time travel, a replayed history)."""

    def answer(self, agent: Agent, paused: Paused, answer: Answer) -> Outcome:
        """Resumes an approval pause with a human's answer."""
