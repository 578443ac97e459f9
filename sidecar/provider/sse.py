"""Server-sent events, parsed incrementally (WHATWG HTML §9.2.6).

Comments, empty lines and `event: ping` are keep-alives: they never make an
event and never commit a stream (provider-retries §10.5).

Parsing is lazy: `feed` splits what arrived into lines (in C, one call per
read) and `next` parses lines only up to the next event, so a stream's
first event is forwarded before the rest of a large read is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_EVENT_BYTES = 1 << 20


class EventTooLarge(ValueError):
    """An event grew past the pre-commit buffer bound (1 MiB)."""


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    data: str
    id: str = ""

    @property
    def keepalive(self) -> bool:
        return self.event == "ping"


@dataclass(slots=True)
class Parser:
    """Feed bytes, take complete events one by one (`next`) or all (`events`)."""

    # Complete lines not parsed yet, from `_at` on.
    _lines: list[bytes] = field(default_factory=list)
    _at: int = 0
    # The last line, still without its end (a lone \r may be half a \r\n).
    _tail: bytes = b""
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str = ""
    _size: int = 0

    def feed(self, chunk: bytes) -> None:
        """Takes the next bytes of the stream; parses nothing yet."""
        data = self._tail + chunk if self._tail else chunk
        if not data:
            return
        # bytes.splitlines breaks at \r\n, \n and \r: the SSE line ends.
        lines = data.splitlines()
        last = data[-1]
        if last == 0x0A:  # \n
            self._tail = b""
        elif last == 0x0D:  # \r: the next byte may make it a \r\n
            self._tail = lines.pop() + b"\r"
        else:
            self._tail = lines.pop()
        if self._at < len(self._lines):
            self._lines = self._lines[self._at :] + lines
        else:
            self._lines = lines
        self._at = 0

    def next(self) -> Event | None:
        """The next complete event of what was fed; None: none yet. Raises
        EventTooLarge once an event outgrows the bound."""
        lines = self._lines
        while self._at < len(lines):
            line = lines[self._at]
            self._at += 1
            if not line:
                if not self._data and not self._event:
                    continue
                done = Event(self._event or "message", "\n".join(self._data), self._id)
                self._event, self._data, self._size = "", [], 0
                return done
            if line[0] == 0x3A:  # ":" a comment
                continue
            self._field(line)
        self._lines, self._at = [], 0
        if len(self._tail) + self._size > MAX_EVENT_BYTES:
            raise EventTooLarge("a server-sent event is larger than 1 MiB")
        return None

    def events(self) -> list[Event]:
        """Every complete event of what was fed."""
        out: list[Event] = []
        while (event := self.next()) is not None:
            out.append(event)
        return out

    def _field(self, line: bytes) -> None:
        self._size += len(line)
        if self._size > MAX_EVENT_BYTES:
            raise EventTooLarge("a server-sent event is larger than 1 MiB")
        name, _, raw = line.partition(b":")
        value = raw[1:] if raw[:1] == b" " else raw
        if name == b"data":
            self._data.append(value.decode("utf-8", errors="replace"))
        elif name == b"event":
            self._event = value.decode("utf-8", errors="replace")
        elif name == b"id":
            self._id = value.decode("utf-8", errors="replace")
