"""A stream's first event is forwarded alone and at once: before the
upstream sends anything more, and before the rest of its read is parsed
(issue 12 item 3). The upstream holds its next chunks until the test has
seen what it expects, so nothing here depends on timing."""

from __future__ import annotations

import threading

from sidecar.provider.client import ProviderClient
from sidecar.provider.messages import Events, StreamEnd, StreamHead, StreamItem
from sidecar.provider.policy import Stop
from tests.provider.support import FakeSleep, request, run
from tests.provider.upstream import Reply, serving


def _data(item: StreamItem) -> list[str]:
    assert isinstance(item, Events)
    return [e.data for e in item.events]


def test_the_first_event_goes_out_alone_before_the_upstream_sends_more() -> None:
    """One read brings a keep-alive and three events, then the upstream
    waits: the first event is an item of its own, the rest of that read the
    next one, both before the upstream is released (fails before the fix:
    the first item held the whole read)."""
    # provider.proto ProviderStreamMessage.events; provider-retries §10.5
    hold = threading.Event()
    reply = Reply(
        events=[b": ka\n\ndata: one\n\ndata: two\n\nevent: ping\n\ndata: three\n\n"],
        hold=hold,
        then=[b"data: four\n\n"],
    )

    async def body(client: ProviderClient, _: FakeSleep) -> list[StreamItem]:
        items = aiter(client.stream(request()))
        seen = [await anext(items), await anext(items), await anext(items)]
        assert not hold.is_set()
        hold.set()
        return seen + [item async for item in items]

    with serving(reply) as up:
        items = run(body, up.base_url)
    assert isinstance(items[0], StreamHead)
    assert [_data(i) for i in items[1:-1]] == [["one"], ["two", "three"], ["four"]]
    end = items[-1]
    assert isinstance(end, StreamEnd)
    assert (end.stop, end.committed, end.events_delivered) == (Stop.SUCCEEDED, True, 4)
    assert len(end.attempts) == 1


def test_a_first_event_split_over_reads_is_forwarded_when_it_is_whole() -> None:
    """An event cut across reads commits the stream only when its end has
    come; what its last read brought after it follows in the next item."""
    # WHATWG SSE (an event ends at a blank line); provider-retries §10.5 S2
    reply = Reply(events=[b"data: o", b"ne\n", b"\ndata: two\n\n", b"data: three\n\n"])
    with serving(reply) as up:

        async def body(client: ProviderClient, _: FakeSleep) -> list[StreamItem]:
            return [item async for item in client.stream(request())]

        items = run(body, up.base_url)
    events = [e for i in items if isinstance(i, Events) for e in _data(i)]
    assert events == ["one", "two", "three"]
    assert _data(items[1]) == ["one"]
