"""What the tests of the client's sessions share, over either transport
and from either client: many threads asking at once, a daemon's framed
connections cut, the checks of a message past its deadline and of a start
whose connection was cut, and the negative controls of a session that sends
again what a broken connection had taken, one that hands an answer to
another caller, one that sends no cancel, and one that sends a message over
the client's limit."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

import grpc
import pytest
from effectd.v1 import ledger_pb2 as pb

from effectd_client import Client, EffectdError
from effectd_client import _session_wire as wire
from effectd_client._frames_wire import frame
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.sessions import Holds


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


def crossed(table: wire.InFlight[object], message_id: int) -> object:
    """BROKEN on purpose (`InFlight.answer` of a negative control): an
    answer goes to another message's caller while others wait."""
    entries = table._entries
    others = [i for i in entries if i != message_id]
    return entries.pop(others[0] if others else message_id, None)


def not_a_cancel(message_id: int) -> object:
    """BROKEN on purpose (`wire.cancel` of a negative control): a message
    that is not a cancel."""
    return pb.SessionRequest(
        id=10_000 + message_id,
        get_tool_call=pb.GetToolCallRequest(ref=pb.CallRef(run_id="r", call_id="x")),
    )


def cut_frames(running: RunningDaemon) -> None:
    """Ends the daemon's side of every framed connection."""
    frames = running.daemon._frames
    assert frames is not None

    def cut() -> None:
        for task in list(frames._connections):
            task.cancel()

    running.loop.call_soon_threadsafe(cut)


def unknown_and_sent_once(failed: Sequence[EffectdError], holds: Holds) -> None:
    """A start held on the daemon when its connection was cut failed with
    its outcome unknown, and the daemon had it once: never sent again."""
    assert [e.metadata.get(wire.MAY_HAVE_BEEN_APPLIED) for e in failed] == ["true"]
    assert holds.entered == 1


def sent_again_is_caught(
    start_cut: Callable[[], object], holds: Holds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control of `unknown_and_sent_once`: a session that sends
    again a message its cut connection had taken gets it to the daemon
    twice."""
    monkeypatch.setattr(wire.InFlight, "broken", all_again)
    start_cut()
    assert holds.entered == 2


def no_cancel_is_caught(
    past_its_deadline: Callable[[], object],
    holds: Holds,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control of a message past its deadline cancelled on the
    daemon: a session that sends no cancel leaves it held there."""
    monkeypatch.setattr(wire, "cancel", not_a_cancel)
    past_its_deadline()
    assert (holds.cut, holds.now) == (0, 1)


#: A tool input over the client's and the daemon's message limit (8 MiB).
BIG = {"x": "a" * (9 << 20)}
#: How the client refuses a message over its limit, as gRPC does.
OVER_THE_LIMIT = "CLIENT: Sent message larger than max ("


def refused_before_it_was_sent(error: EffectdError, kept: bool) -> None:
    """A message over the client's limit failed RESOURCE_EXHAUSTED, as gRPC
    fails one, and its connection served the next message (`kept`)."""
    assert (error.code, error.message[: len(OVER_THE_LIMIT)]) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        OVER_THE_LIMIT,
    )
    assert kept


def _unlimited(message: object, max_bytes: int | None = None) -> bytes:
    """BROKEN on purpose (`frame` of a negative control): no limit."""
    return frame(message)


def sent_over_the_limit_is_caught(
    frames_module: ModuleType,
    over_the_limit: Callable[[], tuple[EffectdError, bool]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control of `refused_before_it_was_sent`: a session that
    sends a frame over the limit has the daemon end the connection at it,
    and the message fails otherwise."""
    monkeypatch.setattr(frames_module, "frame", _unlimited)
    error, kept = over_the_limit()
    assert (error.code, kept) == (grpc.StatusCode.UNAVAILABLE, False)


def second_client_answers(config: ServeConfig, clock: ManualClock) -> bool:
    """With room for one stream per caller, a second client's prepare while
    the first holds the stream: answered, by a unary call."""
    one = dataclasses.replace(
        config,
        server_limits=dataclasses.replace(
            config.server_limits, max_concurrent_rpcs_per_caller=1
        ),
    )
    with running_daemon(one, clock) as d, Client(d.target) as first:
        first.prepare_tool("run-p", "a", "t", {})
        with Client(d.target) as second:
            try:
                second.prepare_tool("run-p", "b", "t", {})
            except EffectdError:
                return False
            assert second._session is not None
            assert not second._session.unary  # a stream again after the pause
            return True
