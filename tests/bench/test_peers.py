"""The arithmetic of the peer comparison (`bench/peer_stats.py`): the
percentile, the same-run ratio and its table, the targets, the profile; and
the harness's check of each phase (`bench/peer_harness.py`)."""

from __future__ import annotations

from typing import Any

import peer_harness
import peer_stats
import pytest


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 0.99, 5.0),  # one value is every percentile
        ([1.0, 2.0, 3.0], 0.5, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),  # between the two middle values
        ([float(i) for i in range(101)], 0.99, 99.0),
        ([0.0, 10.0], 0.99, 9.9),
    ],
)
def test_percentile_interpolates_between_neighbours(
    values: list[float], q: float, expected: float
) -> None:
    """The q-quantile of sorted values, linear between the neighbours."""
    assert peer_stats.percentile(values, q) == pytest.approx(expected)


def record(run: int, peer: str, calls_s: float, p99: float) -> dict[str, Any]:
    return {
        "run": run,
        "peer": peer,
        "callers": 1,
        "phase": "first",
        "valid": True,
        "calls_s": calls_s,
        "p50_ms": 1.0,
        "p99_ms": p99,
    }


def test_the_ratio_pairs_the_two_peers_of_one_run() -> None:
    """The ratio is the median of the per-run ratios, not the ratio of the
    medians; an invalid record counts in neither; the table shows both
    peers' medians and the ratio with its range."""
    records = [
        record(1, "effectd", 100, 4.0),
        record(1, "powertools", 400, 2.0),  # 0.25
        record(2, "effectd", 300, 2.0),
        record(2, "powertools", 600, 2.0),  # 0.5
        record(3, "effectd", 200, 3.0),
        record(3, "powertools", 200, 1.0),  # 1.0
        {**record(4, "effectd", 9999, 0.1), "valid": False},
    ]
    (row,) = peer_stats.rows(records)
    assert (row.phase, row.callers) == ("first", 1)
    assert row.calls_s["effectd"] == peer_stats.Spread(200, 100, 300)
    assert row.ratio == peer_stats.Spread(0.5, 0.25, 1.0)  # medians: 200/400
    assert row.p99_ratio.median == 2.0
    text = peer_stats.table([row])
    assert text.splitlines()[1].split() == [
        "first",
        "1",
        "proc",
        "200",
        "[100-300]",
        "1.00",
        "3.00",
        "400",
        "[200-600]",
        "1.00",
        "2.00",
        "0.50",
        "[0.25-1.00]",
    ]
    markdown = peer_stats.table([row], markdown=True).splitlines()
    assert markdown[1] == "|" + "---|" * len(peer_stats.HEAD)


def test_targets_are_reported_met_or_missed() -> None:
    """A ratio at its limit meets it; a missing row is "not measured"."""
    row = peer_stats.rows(
        [record(1, "effectd", 55, 2.0), record(1, "powertools", 100, 1.0)]
    )
    shown = [t.show() for t in peer_stats.targets(row, 61.0, 150.0)]
    assert shown[0] == "first, 1 caller: calls/s ratio: 0.55 (target >= 0.55) met"
    assert shown[1] == "first, 32 procs: calls/s ratio: not measured"
    assert shown[-2] == "daemon RSS idle, MB: 61.00 (target <= 60) MISSED"
    assert shown[-1].endswith("met")


def test_a_profile_is_summed_per_thread_leaf_and_own_function() -> None:
    collapsed = [
        "thread (1): Main;main (sidecar/cli.py);Handle._run (asyncio/events.py) 6",
        "thread (2): writer;LmdbStore._run (sidecar/storage/lmdb/store.py) 4",
        "not a stack line",
    ]
    p = peer_stats.top_frames(collapsed)
    assert p.samples == 10
    assert p.threads == [("thread (1): Main", 0.6), ("thread (2): writer", 0.4)]
    assert p.self_time[0] == ("Handle._run (asyncio/events.py)", 0.6)
    assert [f for f, _ in p.own_code] == [
        "main (sidecar/cli.py)",
        "LmdbStore._run (sidecar/storage/lmdb/store.py)",
    ]


def phase(runs: list[int]) -> dict[str, Any]:
    return {"t0": 1.0, "t1": 2.0, "ms": [1.0] * len(runs), "runs": runs}


@pytest.mark.parametrize(
    ("first", "dup", "valid"),
    [
        ([1, 1], [0, 0], (True, True)),
        ([1, 2], [0, 0], (False, True)),  # a key's body ran twice
        ([1, 0], [0, 0], (False, True)),  # a key's body never ran
        ([1, 1], [0, 1], (True, False)),  # a duplicate ran the body
    ],
)
def test_a_phase_is_valid_only_if_each_key_ran_as_it_must(
    first: list[int], dup: list[int], valid: tuple[bool, bool]
) -> None:
    """The harness's check, with its negative controls: in `first` the body
    ran exactly once per key, in `dup` never."""
    report = {"worker": 0, "first": phase(first), "dup": phase(dup)}
    result = peer_harness.summarize([report], callers=1, ops=2)
    assert (result["first"]["valid"], result["dup"]["valid"]) == valid
    assert result["first"]["calls_s"] == 2.0


def test_a_caller_that_failed_or_did_not_report_invalidates_both_phases() -> None:
    ok = {"worker": 0, "first": phase([1]), "dup": phase([0])}
    failed = {"worker": 1, "error": "Traceback: AssertionError: key 0 returned {}"}
    for reports in ([ok, failed], [ok]):
        result = peer_harness.summarize(reports, callers=2, ops=1)
        assert not result["first"]["valid"]
        assert not result["dup"]["valid"]
