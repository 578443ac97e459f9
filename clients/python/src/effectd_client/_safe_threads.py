"""The threads of the sync safe call (`effectd_client._safe`): the watcher,
one thread shared by a run's calls, that renews each attempt's lease while
its tool runs and signals its deadline, and the worker thread a decorated
tool with a `timeout` runs in, so that the call can raise `ToolTimedOut` at
the deadline.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for

from effectd_client._client import Client
from effectd_client._exceptions import EffectdError, ToolTimedOut
from effectd_client._recording import RecordingRetry
from effectd_client._safe_base import P, R, SafeCall, renews_after

# Seconds the shared watcher thread waits for a next call before it ends:
# calls in a row share it, and a Run that is dropped leaves no thread behind.
WATCHER_LINGER_S = 5.0


class Watcher:
    """One thread that watches every running call of a `Run`: it signals each
    call's deadline and starts each lease renewal when it is due, in a thread
    of its own (rare: a renewal is due after a third of the lease), so a slow
    renewal never delays another call's. A call costs no thread of its own:
    most calls end before their first renewal. The thread starts with the
    first call to watch and ends after `WATCHER_LINGER_S` without one."""

    def __init__(self) -> None:
        # Reentrant: a call woken under it schedules its next wake.
        self._cond = threading.Condition(threading.RLock())
        self._due: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._running = False
        # When the thread wakes by itself next (monotonic; inf: it waits for
        # a notify): a call due later needs no notify, which would cost a
        # thread switch per call for a wake that finds nothing due.
        self._wakes_at = math.inf

    def watch(self, w: Watch, at: float) -> None:
        """Wakes `w` at monotonic time `at` (its next beat or deadline)."""
        with self._cond:
            self._prune()
            heapq.heappush(self._due, (at, next(self._order), w))
            if not self._running:
                self._running = True
                threading.Thread(
                    target=self._run, name="effectd-watcher", daemon=True
                ).start()
            elif self._due[0][2] is w and at < self._wakes_at:
                self._cond.notify()

    def _prune(self) -> None:
        """Drops the calls that ended from the front (calls in a row end in
        the order they started, so few ever stay behind)."""
        while self._due and self._due[0][2].stopped:
            heapq.heappop(self._due)

    def _run(self) -> None:
        with self._cond:
            while True:
                self._prune()
                if not self._due:
                    self._wakes_at = time.monotonic() + WATCHER_LINGER_S
                    woken = self._cond.wait(WATCHER_LINGER_S)
                    self._wakes_at = math.inf
                    if not woken and not self._due:
                        self._running = False
                        return
                    continue
                at, _, w = self._due[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._wakes_at = at
                    self._cond.wait(wait)
                    self._wakes_at = math.inf
                    continue
                heapq.heappop(self._due)
                w.wake(time.monotonic())


class Watch:
    """While a tool runs: renews its lease, and sets `cancelled` at the
    deadline, woken by its `Watcher`. A lost heartbeat is not fatal (the
    commit is fenced by the attempt); a refused one (the lease is gone) ends
    the renewals."""

    def __init__(
        self,
        watcher: Watcher,
        client: Client,
        scope: SafeCall,
        interval: float,
        lease_ms: int,
        *,
        signal_deadline: bool,
    ) -> None:
        self._watcher = watcher
        self._client, self._scope = client, scope
        self._interval, self._lease_ms = interval, lease_ms
        self._deadline = scope.deadline if signal_deadline else None
        self._retry = RecordingRetry(deadline=max(1.0, interval))
        self._beat_at = time.monotonic() + interval if interval > 0 else None
        self.stopped = False
        self._schedule()

    def stop(self) -> None:
        self.stopped = True

    def _schedule(self) -> None:
        wake = [t for t in (self._beat_at, self._deadline) if t is not None]
        if wake and not self.stopped:
            self._watcher.watch(self, min(wake))

    def wake(self, now: float) -> None:
        """Called by the watcher, under its lock: quick, never blocking."""
        if self._deadline is not None and now >= self._deadline:
            self._scope.cancelled.set()
            self._deadline = None
        if self._beat_at is not None and now >= self._beat_at:
            self._beat_at = None  # the renewal schedules the next one
            threading.Thread(
                target=self._renew,
                name=f"effectd-renew-{self._scope.call_id}",
                daemon=True,
            ).start()
        self._schedule()

    def _renew(self) -> None:
        if self.stopped:
            return
        if self._beat():
            self._beat_at = time.monotonic() + self._interval
            self._schedule()

    def _beat(self) -> bool:
        s = self._scope
        try:
            self._client.heartbeat(
                s.run_id, s.call_id, s.attempt, self._lease_ms, retry=self._retry
            )
        except EffectdError as refusal:
            return renews_after(refusal)
        except Exception:  # a closed client ends the renewals
            return False
        return True


def within_deadline(
    fn: Callable[P, R], step: SafeCall, name: str, *args: P.args, **kwargs: P.kwargs
) -> R:
    """Runs `fn` until it returns or the step's deadline passes."""
    if step.deadline is None:
        return fn(*args, **kwargs)
    done: Future[R] = Future()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            done.set_result(context.run(fn, *args, **kwargs))
        except BaseException as exc:  # handed to the caller
            done.set_exception(exc)

    threading.Thread(target=work, name=f"effectd-tool-{name}", daemon=True).start()
    wait_for([done], timeout=max(0.0, step.deadline - time.monotonic()))
    if not done.done():
        step.cancelled.set()
        raise ToolTimedOut(f"{name} did not finish within its timeout")
    return done.result()
