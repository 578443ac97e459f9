"""The arithmetic of the peer comparison (`bench/peer_stats.py`): the
percentile, the same-run ratio and its table, the targets, the profile; and
the harness's check of each phase (`bench/peer_harness.py`)."""

from __future__ import annotations

from typing import Any

import hotpath_profile
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


def test_the_daemon_cpu_targets_read_the_32_process_medians() -> None:
    """The CPU targets take effectd's daemon CPU per call at 32 processes,
    the median of the valid runs; the table shows both peers' CPU."""
    records = [
        {**record(run, "effectd", 100, 1.0), "callers": 32, "server_cpu_ms": cpu}
        for run, cpu in ((1, 0.5), (2, 0.7), (3, 0.6))
    ] + [
        {**record(1, "powertools", 100, 1.0), "callers": 32, "server_cpu_ms": 0.2},
        {**record(4, "effectd", 1, 1.0), "callers": 32, "valid": False},
    ]
    cpu = peer_stats.daemon_cpu(records)
    assert cpu["first"] == pytest.approx(0.6)
    shown = [t.show() for t in peer_stats.targets(peer_stats.rows(records), 1, 1, cpu)]
    assert (
        "daemon CPU per first execution at 32 procs, ms: 0.60 (target <= 0.6) met"
        in shown
    )
    assert "daemon CPU per duplicate at 32 procs, ms: not measured" in shown
    table = peer_stats.cpu_table(records).splitlines()
    assert table[1].split() == ["first", "32", "effectd", "0.600", "nan"]
    assert table[2].split() == ["first", "32", "powertools", "0.200", "nan"]


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
    return {
        "t0": 1.0,
        "t1": 2.0,
        "ms": [1.0] * len(runs),
        "runs": runs,
        "cpu_s": 0.003,
    }


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
    # The callers' CPU over the phase, per call: 3 ms for 2 calls.
    assert result["first"]["caller_cpu_ms"] == pytest.approx(1.5)


def test_a_caller_that_failed_or_did_not_report_invalidates_both_phases() -> None:
    ok = {"worker": 0, "first": phase([1]), "dup": phase([0])}
    failed = {"worker": 1, "error": "Traceback: AssertionError: key 0 returned {}"}
    for reports in ([ok, failed], [ok]):
        result = peer_harness.summarize(reports, callers=2, ops=1)
        assert not result["first"]["valid"]
        assert not result["dup"]["valid"]


@pytest.mark.parametrize(
    ("stack", "layer"),
    [
        (
            "thread (1): MainThread;_run (asyncio);Handle._run (asyncio/events.py)",
            "serving",
        ),
        ("thread (1): MainThread;x;_Stream._write (sidecar/rpc/session.py)", "serving"),
        (
            "thread (1): MainThread;Boundary.answer (sidecar/rpc/boundary.py)",
            "boundary",
        ),
        (
            "thread (1): MainThread;Boundary.answer (sidecar/rpc/boundary.py);"
            "call_pb (sidecar/rpc/convert.py);__init__ (<string>)",
            "translation",
        ),
        (
            "thread (1): MainThread;LmdbStore._commit (sidecar/storage/lmdb/store.py);"
            "apply (sidecar/services/ledger.py);save_call (sidecar/storage/records.py)",
            "records",
        ),
        (
            "thread (1): MainThread;apply (sidecar/services/ledger.py);"
            "commit (sidecar/ledger/machine.py)",
            "rules",
        ),
        (
            "thread (1): MainThread;LmdbStore._commit_gathered (sidecar/storage/"
            "lmdb_store.py);LmdbStore._commit (sidecar/storage/lmdb/store.py)",
            "commit",
        ),
        (
            "thread (2): Thread-1 (_poll_wrapper);Thread.run (threading.py)",
            "other threads",
        ),
    ],
)
def test_a_profile_sample_is_put_in_its_innermost_layer(stack: str, layer: str) -> None:
    """The budget's layers: the innermost frame of the daemon's code names
    it; the commit's own line, the session's gRPC calls and other threads
    are theirs whatever the rest of the stack."""
    assert hotpath_profile.layer(stack.split(";")) == layer


def test_a_budget_shares_the_measured_cpu_by_samples() -> None:
    counts = hotpath_profile.split(
        [
            "thread (1): MainThread;Handle._run (asyncio/events.py) 3",
            "thread (1): MainThread;Boundary.answer (sidecar/rpc/boundary.py) 1",
            "not a stack",
        ]
    )
    cells = hotpath_profile.per_call(counts, rate=100, calls=10, cpu_ms=2.0)
    assert (cells["serving"], cells["boundary"]) == (1.5, 0.5)
    assert sum(cells.values()) == pytest.approx(2.0)
    sampled = hotpath_profile.per_call(counts, rate=100, calls=10)
    assert sampled["serving"] == pytest.approx(3.0)  # 3 samples of 10 ms, 10 calls
