"""Waiting for the daemon: a request the client knows it did not send is sent
again once the daemon is back, within the call's deadline.

A request is known not sent (or not applied) when its call failed with

  the session stream broken before the message    -> UNAVAILABLE,
    was sent, or a stream that found no connection    mayHaveBeenApplied=false
  a unary call that found no connection            -> UNAVAILABLE, gRPC's "failed
                                                      to connect to all addresses"
  the daemon stopping, before it served the request -> SHUTTING_DOWN

and only then: a request that may have reached the daemon (a stream that broke
after it took the message, a unary call whose connection broke, a deadline)
keeps its failure, whose outcome is unknown; the recording requests are sent
again after those by their own retries (`effectd_client._recording`), which
wait here too between their tries. The daemon's STORAGE_UNAVAILABLE is its
own to retry (its store's pool and writer wait for the database).

Such a request waits with exponential backoff (half of it jittered) for at
most the client's `reconnect_wait` seconds from its first failure, and never
past the call's own deadline; then it fails UNAVAILABLE, saying the daemon
did not come back (still not sent). The first request of an outage logs one
warning on the `effectd_client` logger; the outage ends when a waiting
request gets through, or when the last one waiting gives up.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from types import TracebackType

import grpc

from effectd_client._exceptions import EffectdError
from effectd_client._recording import backoff
from effectd_client._session_wire import MAY_HAVE_BEEN_APPLIED, NO_CONNECTION

# Jitter from the OS, never from the global `random` an application (or a
# test's random search) owns: it keeps no state.
_JITTER = random.SystemRandom()

log = logging.getLogger("effectd_client")

#: Seconds a request known not sent waits for the daemon, by default.
DEFAULT_WAIT = 5.0
# The first wait between two tries, doubling up to the largest: the client's
# channel itself tries to connect at least every second (`_channel`).
_INITIAL_BACKOFF = 0.05
_MAX_BACKOFF = 0.5


def not_sent(error: EffectdError) -> bool:
    """Whether the failed call's request is known not to have reached the
    daemon, or to have been turned away by it unserved (see the module)."""
    if error.code is not grpc.StatusCode.UNAVAILABLE:
        return False
    if error.reason == "SHUTTING_DOWN":
        return True
    if error.reason:
        return False
    if error.metadata.get(MAY_HAVE_BEEN_APPLIED) == "false":
        return True
    return not error.metadata and NO_CONNECTION in error.message


class Outage:
    """The waits of one client for its daemon (thread-safe): how many
    requests wait, and whether this outage was logged."""

    def __init__(self, target: str, wait: float) -> None:
        if wait < 0:
            raise ValueError("reconnect_wait must not be negative")
        self.target = target
        self.wait = wait
        self._lock = threading.Lock()
        self._waiting = 0
        self._logged = False

    def waiting(
        self, error: EffectdError, started: float, timeout: float | None
    ) -> Waiting:
        """The wait of a call begun at `started` (`time.monotonic()`) with
        `timeout` that failed with `error`; raises `error` when its request
        may have been sent, or the client does not wait."""
        if self.wait <= 0 or not not_sent(error):
            raise error
        now = time.monotonic()
        end = now + self.wait
        deadline = None if timeout is None else started + timeout
        if deadline is not None:
            end = min(end, deadline)
        return Waiting(self, error, now, end, deadline)

    def _begin(self, error: EffectdError, seconds: float) -> None:
        with self._lock:
            self._waiting += 1
            first, self._logged = not self._logged, True
        if first:
            log.warning(
                "effectd: waiting up to %.1f s for the daemon at %s to come "
                "back (%s); requests not sent are sent once it serves",
                seconds,
                self.target,
                error,
            )

    def _end(self, back: bool) -> None:
        with self._lock:
            self._waiting -= 1
            if back or not self._waiting:
                self._logged = False


class Waiting:
    """One request's wait (a context manager around its tries): `pause()`
    before each try, then the try with `timeout()`, its failure to
    `failed()`."""

    def __init__(
        self,
        outage: Outage,
        error: EffectdError,
        began: float,
        end: float,
        deadline: float | None,
    ) -> None:
        self._outage = outage
        self._error = error
        self._began = began
        self._end = end
        self._deadline = deadline
        self._tries = 0
        self._back = False

    def __enter__(self) -> Waiting:
        self._outage._begin(self._error, self._end - self._began)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._back = exc_type is None
        self._outage._end(self._back)

    def pause(self) -> float:
        """Seconds to sleep before the next try; raises UNAVAILABLE (the
        daemon did not come back) when the wait is over."""
        left = self._end - time.monotonic()
        if left <= 0:
            raise self._gave_up()
        self._tries += 1
        jitter = _JITTER.random()
        return min(left, backoff(self._tries, _INITIAL_BACKOFF, _MAX_BACKOFF, jitter))

    def timeout(self) -> float | None:
        """The next try's timeout: what is left of the call's deadline."""
        if self._deadline is None:
            return None
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise self._gave_up()
        return left

    def failed(self, error: EffectdError) -> None:
        """A try failed: raises `error` unless its request was not sent
        either (then the wait goes on)."""
        if not not_sent(error):
            raise error
        self._error = error

    def _gave_up(self) -> EffectdError:
        """UNAVAILABLE, not sent; its cause is the last try's failure."""
        waited = time.monotonic() - self._began
        error = EffectdError(
            grpc.StatusCode.UNAVAILABLE,
            "",
            f"the daemon at {self._outage.target} did not come back within "
            f"{waited:.1f} s; the request was not sent (last: {self._error.message})",
            {MAY_HAVE_BEEN_APPLIED: "false"},
            (),
        )
        error.__cause__ = self._error
        return error
