"""Who is signed in: a browser session is a random id in an HttpOnly,
SameSite=Strict cookie, and holds only the token the person signed in with
(the daemon decides what that token may do), a CSRF token for its forms,
and the channel to the daemon. Sessions live in memory: restarting the
console signs everyone out. At most `max_sessions` are kept (each holds a
channel): a new sign-in beyond them ends the session used least recently.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.web.daemon import Daemon

COOKIE = "effectd_console"
# A session unused this long is ended; the next request signs in again.
IDLE_SECONDS = 8 * 3600
MAX_SESSIONS = 256


@dataclass(slots=True)
class Session:
    """One signed-in person."""

    daemon: Daemon
    # The name decisions are recorded under when the daemon has no tokens;
    # with a token, the daemon records the token's own name (and "" is sent).
    actor: str
    shown_name: str
    # The token's roles, as the daemon named them at sign-in; () without one.
    roles: tuple[str, ...] = ()
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    used: float = field(default_factory=time.monotonic)

    def csrf_matches(self, presented: str) -> bool:
        return hmac.compare_digest(self.csrf.encode(), presented.encode())


class Sessions:
    """The sessions of one console, by id."""

    def __init__(
        self,
        now: Callable[[], float] = time.monotonic,
        *,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._now = now
        self._max = max(1, max_sessions)
        self._lock = threading.Lock()
        # Least recently used first.
        self._by_id: dict[str, Session] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)

    def open(self, session: Session) -> str:
        """A new session's id; beyond the cap, the session used least
        recently ends."""
        sid = secrets.token_urlsafe(32)
        session.used = self._now()
        with self._lock:
            self._by_id[sid] = session
            ended = [
                self._by_id.pop(next(iter(self._by_id)))
                for _ in range(len(self._by_id) - self._max)
            ]
        for s in ended:
            s.daemon.close()
        return sid

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        now = self._now()
        ended: list[Session] = []
        with self._lock:
            for key, s in list(self._by_id.items()):
                if now - s.used > IDLE_SECONDS:
                    ended.append(self._by_id.pop(key))
            found = self._by_id.pop(sid, None)
            if found is not None:
                found.used = now
                self._by_id[sid] = found
        for s in ended:
            s.daemon.close()
        return found

    def close(self, sid: str | None) -> None:
        with self._lock:
            found = self._by_id.pop(sid or "", None)
        if found is not None:
            found.daemon.close()

    def close_all(self) -> None:
        with self._lock:
            every, self._by_id = list(self._by_id.values()), {}
        for s in every:
            s.daemon.close()
