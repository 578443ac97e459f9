"""Evidence that a target system de-duplicates on the idempotency key.

ADR-010: "effectively once" holds only when the target system really
de-duplicates on the stable key effectd hands an IDEMPOTENT_WRITE tool
(`${run_id}:${call_id}`), and only the target system's own tests can prove
it: effectd proves only that it does not repeat a call itself. A tool owner
runs `check_deduplication` in their test suite against a real (test)
instance of the target; when it passes, the operator may list the tool as
proven in the policy file, which matters once the policy requires proof:

    [retry]
    require_idempotency_proof = true

    [tools.upsert_contact]
    idempotency_proven = true

A check names two functions of the owner's: `write(key, value)` performs the
tool's effect on the target with idempotency key `key` (as the tool does),
and `count(key)` says how many effects the target holds for that key (rows,
charges, messages carrying it). The check then requires, in order:

  fresh       no effect for a new key yet (the count is not stuck at 1)
  first       one write makes exactly one effect (the count sees effects)
  repeated    writes repeated with the same key add none
  concurrent  writes racing with a new key make exactly one effect (a
              target that checks, then writes, fails here)
  restarted   after `restart()` (when given) a repeat adds none: the
              de-duplication is durable, not a process's memory
  distinct    another key makes its own effect, and the first key's count
              does not move: the count, and the de-duplication, go by key

A repeat that raises (a target may refuse a duplicate, e.g. 409 Conflict) is
counted in the report, not a failure; the first write must succeed. Any
failed requirement raises `DeduplicationNotProven` (an AssertionError, so
test runners show it as a failed test) naming the step.

    from effectd_client.testing import check_deduplication

    def test_crm_upsert_deduplicates(crm):
        check_deduplication(
            write=lambda key, value: crm.upsert(value, idempotency_key=key),
            count=lambda key: crm.count(idempotency_key=key),
            value={"email": "a@example.com"},
            restart=crm.restart,
        )

`check_deduplication_async` is the same for async `write`, `count` and
`restart`.

A user's own tests also get a real daemon and a crash in the middle of a
call, the way effectd's own tests prove a tool runs at most once:

    from effectd_client.testing import CrashPoint, crash_and_resume, running_daemon

    def agent(target: str) -> str:  # module level: it runs in a child too
        with Client(target) as c:
            return book_flight(Run(c, "run-1", lease_ms=500))  # the user's agent

    def test_a_crash_after_booking_does_not_book_twice():
        with running_daemon() as daemon:
            report = crash_and_resume(agent, daemon.target,
                                      at=CrashPoint.BEFORE_COMMIT)
        assert report.crashed
        assert isinstance(report.resumed_error, ReconciliationNeeded)
        assert bookings() == 1

`running_daemon()` is also the pytest fixture `effectd_daemon`
(`pytest_plugins = ["effectd_client.pytest_plugin"]`).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from effectd_client._testing_daemon import (
    CrashPoint,
    CrashReport,
    TestDaemon,
    crash_and_resume,
    running_daemon,
)

__all__ = [
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
]


def idempotency_key(run_id: str, call_id: str) -> str:
    """The key effectd hands an IDEMPOTENT_WRITE tool (scheme 1, ADR-010 D2)."""
    return f"{run_id}:{call_id}"


class DeduplicationNotProven(AssertionError):
    """The target did not show de-duplication on the key; `step` names the
    requirement that failed (see the module docstring)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step


@dataclass(frozen=True, slots=True)
class DeduplicationReport:
    """What a passed check did."""

    key: str
    # Calls of `write` with `key` or the racing key, the first ones included.
    writes: int
    # Repeats that raised (the target refused the duplicate).
    refused_repeats: int
    # The requirements that passed, in order.
    passed: tuple[str, ...]


class _Steps:
    """The requirements, shared by the sync and the async check."""

    def __init__(self, run_id: str | None) -> None:
        run = run_id or f"dedup-check-{uuid.uuid4().hex[:12]}"
        self.key = idempotency_key(run, "call-1")
        self.other = idempotency_key(run, "call-2")
        self.racing = idempotency_key(run, "call-3")
        self.writes = 0
        self.refused = 0
        self.passed: list[str] = []
        self._lock = threading.Lock()

    def wrote(self, *, refused: bool = False) -> None:
        with self._lock:
            self.writes += 1
            self.refused += refused

    def expect(self, step: str, key: str, got: int, want: int, what: str) -> None:
        if got != want:
            raise DeduplicationNotProven(
                step, f"{what}: count({key!r}) is {got}, expected {want}"
            )

    def done(self, step: str) -> None:
        self.passed.append(step)

    def report(self) -> DeduplicationReport:
        return DeduplicationReport(
            self.key, self.writes, self.refused, tuple(self.passed)
        )


def _check_settings(repeats: int, concurrency: int) -> None:
    if repeats < 1 or concurrency < 2:
        raise ValueError("repeats must be at least 1 and concurrency at least 2")


def check_deduplication(
    write: Callable[[str, Any], object],
    count: Callable[[str], int],
    value: Any = None,
    *,
    repeats: int = 3,
    concurrency: int = 4,
    restart: Callable[[], object] | None = None,
    distinct_keys: bool = True,
    run_id: str | None = None,
) -> DeduplicationReport:
    """Checks that `write` de-duplicates on its key, as `count` observes it.

    Args:
        write: Performs the tool's effect on the target with the given
            idempotency key and value.
        count: How many effects the target holds for a key.
        value: The tool's input, passed to every write.
        repeats: Sequential repeats with the same key.
        concurrency: Writes racing with the same key (threads).
        restart: Restarts the target (or its de-duplication store), to
            show the de-duplication is durable; None skips that step.
        distinct_keys: Check that another key makes its own effect (turn off
            only for a target that de-duplicates by content by design).
        run_id: The run id of the keys; a fresh one when None.

    Raises:
        DeduplicationNotProven: a requirement failed; `step` names it.
    """
    _check_settings(repeats, concurrency)
    s = _Steps(run_id)

    def again(key: str) -> None:
        try:
            write(key, value)
        except Exception:  # A target may refuse a duplicate: not a failure.
            s.wrote(refused=True)
        else:
            s.wrote()

    s.expect("fresh", s.key, count(s.key), 0, "a new key already has effects")
    s.done("fresh")
    write(s.key, value)
    s.wrote()
    s.expect("first", s.key, count(s.key), 1, "one write")
    s.done("first")
    for _ in range(repeats):
        again(s.key)
    s.expect("repeated", s.key, count(s.key), 1, f"{repeats} repeats")
    s.done("repeated")
    s.expect("concurrent", s.racing, count(s.racing), 0, "a new key has effects")
    barrier = threading.Barrier(concurrency)

    def racer() -> None:
        barrier.wait(timeout=30)
        again(s.racing)

    threads = [threading.Thread(target=racer) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    got = count(s.racing)
    s.expect("concurrent", s.racing, got, 1, f"{concurrency} racing first writes")
    s.done("concurrent")
    if restart is not None:
        restart()
        again(s.key)
        s.expect("restarted", s.key, count(s.key), 1, "a repeat after a restart")
        s.done("restarted")
    if distinct_keys:
        write(s.other, value)
        s.expect("distinct", s.other, count(s.other), 1, "another key's write")
        s.expect("distinct", s.key, count(s.key), 1, "after another key's write")
        s.done("distinct")
    return s.report()


async def check_deduplication_async(
    write: Callable[[str, Any], Awaitable[object]],
    count: Callable[[str], Awaitable[int]],
    value: Any = None,
    *,
    repeats: int = 3,
    concurrency: int = 4,
    restart: Callable[[], Awaitable[object]] | None = None,
    distinct_keys: bool = True,
    run_id: str | None = None,
) -> DeduplicationReport:
    """`check_deduplication` for async functions; the racing writes are
    tasks started together."""
    _check_settings(repeats, concurrency)
    s = _Steps(run_id)

    async def again(key: str) -> None:
        try:
            await write(key, value)
        except Exception:  # A target may refuse a duplicate: not a failure.
            s.wrote(refused=True)
        else:
            s.wrote()

    s.expect("fresh", s.key, await count(s.key), 0, "a new key already has effects")
    s.done("fresh")
    await write(s.key, value)
    s.wrote()
    s.expect("first", s.key, await count(s.key), 1, "one write")
    s.done("first")
    for _ in range(repeats):
        await again(s.key)
    s.expect("repeated", s.key, await count(s.key), 1, f"{repeats} repeats")
    s.done("repeated")
    got = await count(s.racing)
    s.expect("concurrent", s.racing, got, 0, "a new key has effects")
    await asyncio.gather(*(again(s.racing) for _ in range(concurrency)))
    got = await count(s.racing)
    s.expect("concurrent", s.racing, got, 1, f"{concurrency} racing first writes")
    s.done("concurrent")
    if restart is not None:
        await restart()
        await again(s.key)
        got = await count(s.key)
        s.expect("restarted", s.key, got, 1, "a repeat after a restart")
        s.done("restarted")
    if distinct_keys:
        await write(s.other, value)
        got = await count(s.other)
        s.expect("distinct", s.other, got, 1, "another key's write")
        s.expect("distinct", s.key, await count(s.key), 1, "after another key's write")
        s.done("distinct")
    return s.report()
