"""`bench/pg_scrape.py` runs, and both of its ways count what it stored:
the store's own count and the walk it is measured against."""

from __future__ import annotations

from pg_scrape import measure


def test_both_ways_of_a_scrape_count_the_stored_calls(pg_url: str) -> None:
    medians = measure(pg_url, calls=40, rounds=1)
    assert set(medians) == {"count", "walk"}
