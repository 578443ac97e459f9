"""How the recording RPCs are retried: CommitTool, ReportUnknown, Heartbeat
and AcknowledgeRecovery.

The daemon answers each of them the same when it is sent again with the same
attempt: a commit of the result already stored is answered as done (another
result is `RESULT_MISMATCH`), a second ReportUnknown finds the call UNKNOWN
under that attempt and answers it, a heartbeat extends the lease again, and an
acknowledged call stays acknowledged. So a request whose answer was lost, or
that a transient refusal turned away, is sent again, with the same attempt,
within a bounded number of tries and a deadline, with backoff. A try that
finds the daemon away waits for it first, within the try's timeout
(`effectd_client._reconnect`), so that an outage costs the tries only one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from effectd_client._exceptions import EffectdError

# Jitter from the OS, never from the global `random` an application (or a
# test's random search) owns: it keeps no state.
_JITTER = random.SystemRandom()


def transient(error: EffectdError) -> bool:
    """Whether trying the same recording request again can succeed.

    UNAVAILABLE (no connection, a daemon shutting down or whose storage
    failed), a deadline of the try itself (the request may have landed: the
    repeat is answered the same), and any refusal that says when to try again
    (`google.rpc.RetryInfo`, e.g. RATE_LIMITED).
    """
    if error.code is grpc.StatusCode.UNAVAILABLE:
        return True
    if error.code is grpc.StatusCode.DEADLINE_EXCEEDED and not error.reason:
        return True
    return error.retry_delay is not None


def backoff(tries: int, initial: float, maximum: float, jitter: float) -> float:
    """Seconds to wait after try `tries`: `initial` doubling up to `maximum`,
    half of it jittered (`jitter` in [0, 1))."""
    full = min(maximum, initial * 2.0 ** (tries - 1))
    return full / 2 + jitter * full / 2


@dataclass(frozen=True, slots=True)
class RecordingRetry:
    """Tries of one recording request: `attempts` at most, within `deadline`
    seconds, waiting `initial_backoff` doubling up to `max_backoff` (half of
    it jittered), never less than a refusal's `retry_delay`.

    `on_retry(error, wait)` is called before each wait (for logs, metrics and
    tests).
    """

    attempts: int = 8
    deadline: float = 30.0
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    on_retry: Callable[[EffectdError, float], object] | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.deadline <= 0 or self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError("deadline must be positive and backoffs not negative")

    def wait(
        self, tries: int, error: EffectdError, elapsed: float, jitter: float
    ) -> float | None:
        """Seconds to wait before try `tries + 1`, or None: give up.

        `elapsed` is the time since the first try; `jitter` is in [0, 1).
        """
        if tries >= self.attempts or not transient(error):
            return None
        delay = backoff(tries, self.initial_backoff, self.max_backoff, jitter)
        if error.retry_delay is not None:
            delay = max(delay, error.retry_delay)
        if elapsed + delay >= self.deadline:
            return None
        return delay

    def next_wait(self, tries: int, error: EffectdError, elapsed: float) -> float:
        """The seconds to wait before the next try, `on_retry` told of them;
        raises `error` when the tries end here (see `wait`)."""
        wait = self.wait(tries, error, elapsed, _JITTER.random())
        if wait is None:
            raise error from None
        if self.on_retry is not None:
            self.on_retry(error, wait)
        return wait

    def try_timeout(self, per_call: float, elapsed: float) -> float:
        """The deadline of one try: the client's, cut to what is left."""
        return max(0.001, min(per_call, self.deadline - elapsed))


# One try only: a last, best-effort note to the ledger.
ONCE = RecordingRetry(attempts=1)
