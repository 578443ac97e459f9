"""Server-sent events, parsed incrementally (WHATWG HTML §9.2.6).

Comments, empty lines and `event: ping` are keep-alives: they never make an
event and never commit a stream (provider-retries §10.5).
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
    """Feed bytes, take complete events."""

    _buffer: bytearray = field(default_factory=bytearray)
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str = ""
    _size: int = 0

    def feed(self, chunk: bytes) -> list[Event]:
        self._buffer += chunk
        events: list[Event] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            end, width = cut
            line = bytes(self._buffer[:end]).decode("utf-8", errors="replace")
            del self._buffer[: end + width]
            done = self._line(line)
            if done is not None:
                events.append(done)
        if len(self._buffer) + self._size > MAX_EVENT_BYTES:
            raise EventTooLarge("a server-sent event is larger than 1 MiB")
        return events

    def _line(self, line: str) -> Event | None:
        if line == "":
            if not self._data and not self._event:
                return None
            done = Event(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._size = "", [], 0
            return done
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        self._size += len(line)
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


def _line_end(buffer: bytearray) -> tuple[int, int] | None:
    lf, cr = buffer.find(b"\n"), buffer.find(b"\r")
    if cr != -1 and (lf == -1 or cr < lf):
        if cr + 1 == len(buffer):
            return None  # a \r\n may be split across chunks
        return (cr, 2) if buffer[cr + 1 : cr + 2] == b"\n" else (cr, 1)
    return None if lf == -1 else (lf, 1)
