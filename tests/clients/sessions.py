"""What the tests of the client's sessions share, over either transport:
many threads asking at once, and the negative control of a session that
sends again what a broken connection had taken."""

from __future__ import annotations

import threading

from effectd_client import Client
from effectd_client import _session_wire as wire


def prepare_at_once(client: Client, n: int) -> dict[str, str]:
    """`n` threads prepare `n` calls at once: the call id each got back."""
    got: dict[str, str] = {}
    start = threading.Barrier(n)

    def one(i: int) -> None:
        start.wait(timeout=30)
        p = client.prepare_tool("run-many", f"c{i}", "t", {"i": i})
        got[f"c{i}"] = p.call.call_id

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return got


def all_again(
    table: wire.InFlight[object], stream: object
) -> tuple[list[wire.Entry[object]], list[wire.Entry[object]]]:
    """BROKEN on purpose (`InFlight.broken` of a negative control): every
    message of the broken stream is sent again, those it had taken too."""
    again = table.take(stream)
    for entry in again:
        entry.sent, entry.stream = False, None
        table._entries[entry.message.id] = entry
    return [], again
