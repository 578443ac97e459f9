"""The host-wide retry budget (provider-retries §10.4) and the SSE parser (§10.5)."""

from __future__ import annotations

import pytest

from sidecar.clock import ManualClock
from sidecar.provider.budget import RetryBudget
from sidecar.provider.sse import Event, EventTooLarge, Parser


def test_a_fresh_budget_has_its_full_reserve() -> None:
    """A fresh daemon can retry 10 times from the reserve, then no more."""
    # provider-retries §10.4 (reserve starts full: documented in provider.proto)
    budget = RetryBudget(ManualClock())
    assert [budget.withdraw("k") for _ in range(11)] == [True] * 10 + [False]


def test_first_attempts_deposit_a_fifth() -> None:
    """With the reserve spent, five first attempts buy one retry."""
    # provider-retries §10.4 ratio 0.2
    budget = RetryBudget(ManualClock(), reserve_cap=0)
    for _ in range(4):
        budget.deposit("k")
    assert not budget.withdraw("k")
    budget.deposit("k")
    assert budget.withdraw("k")
    assert not budget.withdraw("k")


def test_deposits_expire_after_the_ttl() -> None:
    """Deposits older than 10 s no longer pay for retries."""
    # provider-retries §10.4 ttl
    clock = ManualClock()
    budget = RetryBudget(clock, reserve_cap=0)
    for _ in range(5):
        budget.deposit("k")
    clock.advance(11)
    assert not budget.withdraw("k")


def test_the_reserve_refills_one_per_second_up_to_its_cap() -> None:
    """The reserve refills 1 credit per second, capped at 10."""
    # provider-retries §10.4 reserve
    clock = ManualClock()
    budget = RetryBudget(clock)
    for _ in range(10):
        assert budget.withdraw("k")
    clock.advance(2.5)
    assert [budget.withdraw("k") for _ in range(3)] == [True, True, False]
    clock.advance(1000)
    assert budget.available("k") == pytest.approx(10.0)


def test_keys_are_separate() -> None:
    """One upstream's storm does not spend another's budget."""
    # provider-retries §10.4 per upstream key
    budget = RetryBudget(ManualClock())
    for _ in range(10):
        budget.withdraw("a")
    assert not budget.withdraw("a")
    assert budget.withdraw("b")


def _fed(parser: Parser, chunk: bytes) -> list[Event]:
    parser.feed(chunk)
    return parser.events()


def test_sse_events_across_chunks_and_line_endings() -> None:
    """Events split across chunks, with CRLF or CR endings, multi-line data."""
    # WHATWG SSE
    parser = Parser()
    assert _fed(parser, b"event: delta\r\ndata: a") == []
    assert _fed(parser, b"\r\ndata: b\r") == []
    assert _fed(parser, b"\n\r\n") == [Event("delta", "a\nb")]
    # A trailing CR may be the first half of a CRLF: it waits for the next byte.
    assert _fed(parser, b"id: 7\rdata: c\r\r") == []
    assert _fed(parser, b"data: d\n") == [Event("message", "c", "7")]


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_sse_events_are_the_same_however_the_bytes_are_cut(size: int) -> None:
    """Any cut of a stream into chunks gives the same events (line ends of
    every kind, split anywhere, a CRLF split in its middle, UTF-8 split)."""
    # WHATWG SSE
    stream = (
        b"event: a\r\ndata: 1\r\n\r\n: c\rdata: 2\rdata:3\r\rid: x\n"
        b"data: \xc3\xa9t\xc3\xa9\n\nevent: ping\ndata: {}\n\n"
    )
    expected = [
        Event("a", "1"),
        Event("message", "2\n3"),
        Event("message", "\u00e9t\u00e9", "x"),
        Event("ping", "{}", "x"),
    ]
    parser = Parser()
    got: list[Event] = []
    for at in range(0, len(stream), size):
        got += _fed(parser, stream[at : at + size])
    assert got == expected
    whole = Parser()
    assert _fed(whole, stream) == expected


def test_sse_events_are_parsed_one_at_a_time() -> None:
    """`next` parses up to one event and leaves the rest of the read for
    later: the first event of a large read is out before the rest is read."""
    # provider.proto ProviderStreamMessage.events: the first event goes alone
    parser = Parser()
    parser.feed(b": ka\n\ndata: a\n\ndata: b\n\ndata: c")
    assert parser.next() == Event("message", "a")
    assert parser.next() == Event("message", "b")
    assert parser.next() is None
    parser.feed(b"\n\n")
    assert parser.events() == [Event("message", "c")]


def test_sse_bytes_fed_before_the_last_read_is_parsed_keep_their_order() -> None:
    """Feeding again before every event of the last read was taken keeps
    the events in stream order; feeding nothing changes nothing."""
    # WHATWG SSE
    parser = Parser()
    parser.feed(b"data: a\n\ndata: b\n\n")
    assert parser.next() == Event("message", "a")
    parser.feed(b"")
    parser.feed(b"data: c\n\n")
    assert parser.events() == [Event("message", "b"), Event("message", "c")]


def test_sse_comments_and_blank_lines_are_no_events() -> None:
    """Comments and blank lines are keep-alives; `event: ping` is flagged."""
    # provider-retries §10.5 keep-alives
    parser = Parser()
    assert _fed(parser, b": hello\n\n\n\n") == []
    [ping] = _fed(parser, b"event: ping\ndata: {}\n\n")
    assert ping.keepalive


def test_sse_events_are_bounded() -> None:
    """An event larger than the 1 MiB pre-commit bound is refused, whether
    its line has ended or not."""
    # provider-retries §10.1 response pre-commit buffer
    with pytest.raises(EventTooLarge):
        _fed(Parser(), b"data: " + b"x" * (1 << 20) + b"\n")
    with pytest.raises(EventTooLarge):
        _fed(Parser(), b"data: " + b"x" * (1 << 20))
    many_lines = b"data: " + b"x" * 1024 + b"\n"
    with pytest.raises(EventTooLarge):
        _fed(Parser(), many_lines * (1 << 10))
