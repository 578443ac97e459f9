"""`effectd_client.testing`: the de-duplication check tool owners run against
their target system (ADR-010 "test evidence"). A target that de-duplicates
durably on the key passes; each way of not doing so is caught at its step
(the negative controls), and the step is named."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

import effectd_client.testing
from effectd_client.testing import (
    DeduplicationNotProven,
    check_deduplication,
    check_deduplication_async,
    idempotency_key,
)

RUN = "owner-test"
RACING = idempotency_key(RUN, "call-3")


class Target:
    """An in-memory target system that de-duplicates on the key, durably:
    its key table survives `restart` (as a database table would)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.effects: Counter[str] = Counter()

    def write(self, key: str, value: Any) -> None:
        with self.lock:
            if key in self.seen:
                return
            self.seen.add(key)
            self.effects[key] += 1

    def count(self, key: str) -> int:
        return self.effects[key]

    def restart(self) -> None:
        pass


class NoDeduplication(Target):
    """BROKEN on purpose: every write is an effect."""

    def write(self, key: str, value: Any) -> None:
        with self.lock:
            self.effects[key] += 1


class CheckThenWrite(Target):
    """BROKEN on purpose: checks for the key, then writes, without a lock or
    a unique constraint; racing first writes all pass the check."""

    def __init__(self, concurrency: int) -> None:
        super().__init__()
        self.gate = threading.Barrier(concurrency)

    def write(self, key: str, value: Any) -> None:
        present = key in self.seen
        if key == RACING:
            self.gate.wait(timeout=10)  # every racer has checked
        if not present:
            with self.lock:
                self.seen.add(key)
                self.effects[key] += 1


class Forgetful(Target):
    """BROKEN on purpose: de-duplicates in process memory only."""

    def restart(self) -> None:
        self.seen = set()


class CountIgnoresKey(Target):
    """BROKEN on purpose: the count sees every effect, whatever the key, so
    it cannot show de-duplication on the key."""

    def count(self, key: str) -> int:
        return sum(self.effects.values())


class RefusesDuplicates(Target):
    """A target that answers a duplicate with an error (409 Conflict)."""

    def write(self, key: str, value: Any) -> None:
        with self.lock:
            if key in self.seen:
                raise RuntimeError("409 Conflict")
            self.seen.add(key)
            self.effects[key] += 1


def _check(target: Target, **kw: Any) -> effectd_client.testing.DeduplicationReport:
    return check_deduplication(
        target.write,
        target.count,
        {"email": "a@example.com"},
        restart=target.restart,
        run_id=RUN,
        **kw,
    )


def test_a_target_that_deduplicates_durably_passes() -> None:
    """Every step passes for a target that de-duplicates on the key, durably
    (issue 10 item 16: fails before the fix: there was no such helper)."""
    report = _check(Target())
    assert report.passed == (
        "fresh",
        "first",
        "repeated",
        "concurrent",
        "restarted",
        "distinct",
    )
    assert report.key == f"{RUN}:call-1"
    assert (report.writes, report.refused_repeats) == (1 + 3 + 4 + 1, 0)


def test_a_refused_duplicate_is_not_a_failure() -> None:
    """A target that refuses duplicates with an error passes; the report
    counts the refusals."""
    report = _check(RefusesDuplicates())
    assert report.refused_repeats == 3 + 3 + 1


@pytest.mark.parametrize(
    ("target", "step"),
    [
        (NoDeduplication(), "repeated"),
        (CheckThenWrite(4), "concurrent"),
        (Forgetful(), "restarted"),
        (CountIgnoresKey(), "concurrent"),
    ],
    ids=["no-dedup", "check-then-write", "forgetful", "count-ignores-key"],
)
def test_negative_controls_each_flaw_is_caught_at_its_step(
    target: Target, step: str
) -> None:
    """Each broken target fails the check, at the step that shows its flaw."""
    with pytest.raises(DeduplicationNotProven) as raised:
        _check(target)
    assert raised.value.step == step
    assert isinstance(raised.value, AssertionError)


def test_a_count_stuck_at_one_is_caught_first() -> None:
    """A count that always says 1 is caught before any write."""
    with pytest.raises(DeduplicationNotProven) as raised:
        check_deduplication(lambda key, value: None, lambda key: 1)
    assert raised.value.step == "fresh"


def test_settings_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="repeats"):
        _check(Target(), repeats=0)
    with pytest.raises(ValueError, match="concurrency"):
        _check(Target(), concurrency=1)


class AsyncTarget:
    """`Target` for async tools; `racy` checks, yields, then writes."""

    def __init__(self, *, dedup: bool = True, racy: bool = False) -> None:
        self.dedup, self.racy = dedup, racy
        self.seen: set[str] = set()
        self.effects: Counter[str] = Counter()

    async def write(self, key: str, value: Any) -> None:
        present = key in self.seen
        if self.racy:
            await asyncio.sleep(0)  # every racing task checks first
        if self.dedup and present:
            return
        self.seen.add(key)
        self.effects[key] += 1

    async def count(self, key: str) -> int:
        return self.effects[key]

    async def restart(self) -> None:
        pass


@pytest.mark.parametrize(
    ("target", "step"),
    [
        (AsyncTarget(), None),
        (AsyncTarget(dedup=False), "repeated"),
        (AsyncTarget(racy=True), "concurrent"),
    ],
    ids=["dedup", "no-dedup", "check-then-write"],
)
def test_the_async_check(target: AsyncTarget, step: str | None) -> None:
    """The async check passes the same target and catches the same flaws."""

    async def run() -> effectd_client.testing.DeduplicationReport:
        return await check_deduplication_async(
            target.write, target.count, 1, restart=target.restart, run_id=RUN
        )

    if step is None:
        assert asyncio.run(run()).passed[-1] == "distinct"
        return
    with pytest.raises(DeduplicationNotProven) as raised:
        asyncio.run(run())
    assert raised.value.step == step


def test_the_key_is_the_ledgers() -> None:
    """The helper's keys are the ledger's scheme 1 keys."""
    assert idempotency_key("run-1", "call-9") == "run-1:call-9"


def test_the_export_list_is_pinned() -> None:
    """The module's public names, each importable."""
    assert set(effectd_client.testing.__all__) == {
        "CrashPoint",
        "CrashReport",
        "DeduplicationNotProven",
        "DeduplicationReport",
        "TestDaemon",
        "check_deduplication",
        "check_deduplication_async",
        "crash_and_resume",
        "idempotency_key",
        "running_daemon",
    }
    for name in effectd_client.testing.__all__:
        assert getattr(effectd_client.testing, name)
