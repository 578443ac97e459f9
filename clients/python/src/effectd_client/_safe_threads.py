"""The threads of the sync safe call (`effectd_client._safe`): the watch that
renews an attempt's lease while its tool runs and signals its deadline, and
the worker thread a decorated tool with a `timeout` runs in, so that the call
can raise `ToolTimedOut` at the deadline.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for

from effectd_client._client import Client
from effectd_client._exceptions import EffectdError, ToolTimedOut
from effectd_client._recording import RecordingRetry
from effectd_client._safe_base import P, R, SafeCall, renews_after


class Watch:
    """While a tool runs: renews its lease, and sets `cancelled` at the
    deadline. A lost heartbeat is not fatal (the commit is fenced by the
    attempt); a refused one (the lease is gone) ends the renewals."""

    def __init__(
        self,
        client: Client,
        scope: SafeCall,
        interval: float,
        lease_ms: int,
        *,
        signal_deadline: bool,
    ) -> None:
        self._client, self._scope = client, scope
        self._interval, self._lease_ms = interval, lease_ms
        self._deadline = scope.deadline if signal_deadline else None
        self._stop = threading.Event()
        self._retry = RecordingRetry(deadline=max(1.0, interval))
        self._thread: threading.Thread | None = None
        if interval > 0 or self._deadline is not None:
            self._thread = threading.Thread(
                target=self._run, name=f"effectd-watch-{scope.call_id}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        s = self._scope
        beat = time.monotonic() + self._interval if self._interval > 0 else None
        deadline = self._deadline
        while beat is not None or deadline is not None:
            wake = min(t for t in (beat, deadline) if t is not None)
            if self._stop.wait(max(0.0, wake - time.monotonic())):
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                s.cancelled.set()
                deadline = None
            if beat is not None and now >= beat:
                beat = now + self._interval if self._beat() else None

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
