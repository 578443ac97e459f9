"""What the crash loop checks after every cycle, from outside the daemon.

Three sources: the side-effect counter (every execution of a tool, appended
by the agents before the result goes to the daemon), the acknowledgement log
(what the daemon answered, appended by the agents after the answer), and the
store as the daemon serves it (ListToolCalls). The promises:

- a SIDE_EFFECT runs at most once per call, with attempt 1 (an unknown
  outcome is never started again: it waits for reconciliation);
- an attempt runs at most once (the fencing token is never given twice), and
  every execution of an IDEMPOTENT_WRITE carries the call's one key;
- every acknowledged commit is COMMITTED with the attempt and the exact bytes
  (or error code) acknowledged, and its result came from an execution;
- a committed record stays committed with the same result, and no record's
  revision ever goes back, across every restart;
- no call is still STARTED by an attempt that began before the daemon's
  last kill (the restart made it UNKNOWN);
- no recovery plan says EXECUTE for a call whose last attempt may have run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from effectd_client import Client, Effect, State, ToolCall

Ref = tuple[str, str]


@dataclass(slots=True)
class Figures:
    cycles: int = 0
    daemon_kills: int = 0
    agent_kills: int = 0
    connections_dropped: int = 0
    # Database restarts (of them, immediate stops: crashes; outages of
    # seconds), the time the daemon took to commit a write once the database
    # was back, and the writes so acknowledged (`tests.torture.crash_database`).
    database_restarts: int = 0
    database_crashes: int = 0
    long_outages: int = 0
    recovery_ms_total: int = 0
    recovery_ms_max: int = 0
    probe_writes: int = 0
    lmdb_checks: int = 0
    lmdb_keys_read: int = 0
    runs: int = 0
    effects: int = 0
    acknowledged: int = 0
    commits_checked: int = 0
    records_checked: int = 0
    started_seen: int = 0
    reconciliations: int = 0
    attempts_exhausted: int = 0
    unknown_records: int = 0
    plans_read: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Lines:
    """The complete lines a file has gained since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines()]


@dataclass(frozen=True, slots=True)
class Seen:
    """A record as a check saw it committed."""

    attempt: int
    result: bytes | None
    error: str


@dataclass(slots=True)
class Checker:
    counter_path: Path
    acks_path: Path
    figures: Figures = field(default_factory=Figures)
    effects: dict[Ref, list[dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    acks: dict[Ref, list[dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    revisions: dict[Ref, int] = field(default_factory=dict)
    committed: dict[Ref, Seen] = field(default_factory=dict)
    # The daemon's last kill (wall clock, ns): no call may still be STARTED
    # by an attempt that began before it.
    killed_ns: int = 0
    # Runs whose new lines are not yet compared with their records.
    pending: set[str] = field(default_factory=set)
    counter: Lines = field(init=False)
    acknowledgements: Lines = field(init=False)

    def __post_init__(self) -> None:
        self.counter = Lines(self.counter_path)
        self.acknowledgements = Lines(self.acks_path)

    def ended(self, run_id: str) -> None:
        self.pending.add(run_id)

    def check(self, client: Client, active: set[str], *, full: bool) -> list[str]:
        # Acknowledgements before the records (each was answered before its
        # line), executions after them (each precedes its commit): a record
        # listed is never newer than the lines it is compared with.
        found = self._read_acks()
        if full:
            runs = None
            records = list(client.list_tool_calls(page_size=1000))
        else:
            runs = active | self.pending
            records = [
                c
                for run in sorted(runs)
                for c in client.list_tool_calls(run, page_size=1000)
            ]
        self.pending.clear()
        found += self._read_counter()
        by_ref = {(c.run_id, c.call_id): c for c in records}
        found += self._records(records)
        refs = [r for r in self.acks if runs is None or r[0] in runs]
        for ref in refs:
            found += self._acknowledged(ref, by_ref.get(ref))
        if full:
            self.figures.unknown_records = sum(
                1 for c in records if c.state is State.UNKNOWN
            )
        return found

    def _read_counter(self) -> list[str]:
        found = []
        for entry in self.counter.new():
            ref = (entry["run"], entry["call"])
            self.pending.add(ref[0])
            done = self.effects[ref]
            self.figures.effects += 1
            if any(e["attempt"] == entry["attempt"] for e in done):
                found.append(f"{ref}: attempt {entry['attempt']} executed twice")
            if entry["effect"] == Effect.SIDE_EFFECT.name and done:
                found.append(f"{ref}: side effect executed {len(done) + 1} times")
            if entry["effect"] == Effect.IDEMPOTENT_WRITE.name and any(
                e["key"] != entry["key"] for e in done
            ):
                found.append(f"{ref}: idempotency key changed: {entry['key']!r}")
            done.append(entry)
        return found

    def _read_acks(self) -> list[str]:
        found = []
        for entry in self.acknowledgements.new():
            self.pending.add(entry["run"])
            if "plan" in entry:
                self.figures.plans_read += 1
                if unsafe := entry["unsafe_plan"]:
                    found.append(f"{entry['run']}: plan executes {unsafe}")
                continue
            if "reconcile" in entry:
                self.figures.reconciliations += 1
                continue
            if "exhausted" in entry:
                self.figures.attempts_exhausted += 1
                continue
            ref = (entry["run"], entry["call"])
            if not self.acks[ref]:
                self.figures.acknowledged += 1
            self.acks[ref].append(entry)
        return found

    def _records(self, records: list[ToolCall]) -> list[str]:
        found = []
        for call in records:
            ref = (call.run_id, call.call_id)
            self.figures.records_checked += 1
            before = self.revisions.get(ref, 0)
            if call.revision < before:
                found.append(f"{ref}: revision {call.revision} after {before}")
            self.revisions[ref] = max(before, call.revision)
            if call.state is State.STARTED:
                self.figures.started_seen += 1
            if call.state is State.STARTED and call.updated_ns < self.killed_ns:
                found.append(f"{ref}: still STARTED by an attempt of a killed daemon")
            if call.effect is Effect.SIDE_EFFECT and call.attempt > 1:
                found.append(f"{ref}: side effect given attempt {call.attempt}")
            seen = self.committed.get(ref)
            if call.state is State.COMMITTED and call.result is not None:
                now = Seen(call.attempt, call.result.raw, call.result.error_code)
                if seen is not None and seen != now:
                    found.append(f"{ref}: committed {seen} became {now}")
                self.committed.setdefault(ref, now)
                executed = {e["attempt"] for e in self.effects.get(ref, [])}
                if call.attempt not in executed:
                    found.append(f"{ref}: result of attempt {call.attempt}, never run")
            elif seen is not None:
                found.append(f"{ref}: committed {seen} is now {call.state.name}")
        return found

    def _acknowledged(self, ref: Ref, call: ToolCall | None) -> list[str]:
        found = []
        for entry in self.acks[ref]:
            self.figures.commits_checked += 1
            if call is None:
                found.append(f"{ref}: acknowledged, missing")
                continue
            if call.state is not State.COMMITTED or call.result is None:
                found.append(f"{ref}: acknowledged, now {call.state.name}")
                continue
            if call.attempt != entry["attempt"]:
                found.append(
                    f"{ref}: acknowledged attempt {entry['attempt']}, "
                    f"stored {call.attempt}"
                )
            if "error" in entry:
                if call.result.ok or call.result.error_code != entry["error"]:
                    found.append(
                        f"{ref}: acknowledged error {entry['error']}, "
                        f"stored {call.result.error_code!r}"
                    )
            elif call.result.raw != bytes.fromhex(entry["result"]):
                found.append(
                    f"{ref}: acknowledged {entry['result']}, stored {call.result.raw!r}"
                )
        return found
