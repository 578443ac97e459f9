"""The arithmetic of the peer comparison (`bench/peers.py`), and nothing else.

Pure functions of measured numbers: percentiles, the median of repeated runs
with its range, the same-run ratio effectd / Powertools, the table, the
targets and the summary of a py-spy profile. Standard library only: the
harness imports it under the project's venv and under the bench venv.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PEERS = ("effectd", "powertools")
PHASES = ("first", "dup")
CALLERS = (1, 32)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, linear between neighbours."""
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclasses.dataclass(frozen=True, slots=True)
class Spread:
    """The median of repeated runs, with the smallest and the largest."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        vals = list(values)
        if not vals:
            return cls(float("nan"), float("nan"), float("nan"))
        return cls(statistics.median(vals), min(vals), max(vals))

    def show(self, spec: str, ranged: bool = True) -> str:
        if self.median != self.median:  # NaN: nothing measured
            return "-"
        mid = format(self.median, spec)
        if not ranged or self.low == self.high:
            return mid
        return f"{mid} [{self.low:{spec}}-{self.high:{spec}}]"


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One phase at one caller count: both peers and their same-run ratios."""

    phase: str
    callers: int
    calls_s: Mapping[str, Spread]
    p50_ms: Mapping[str, Spread]
    p99_ms: Mapping[str, Spread]
    ratio: Spread  # effectd calls/s / Powertools calls/s, run by run
    p99_ratio: Spread  # effectd p99 / Powertools p99, run by run


def rows(records: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Aggregates valid records (run, peer, callers, phase, calls_s, p50_ms,
    p99_ms) into the table's rows; a ratio pairs the two peers of one run."""
    by: dict[tuple[str, int, str, int], Mapping[str, Any]] = {}
    for r in records:
        if r.get("valid"):
            by[(r["phase"], r["callers"], r["peer"], r["run"])] = r
    out: list[Row] = []
    for phase in PHASES:
        for callers in CALLERS:
            own = {
                peer: [
                    r
                    for (ph, c, p, _), r in by.items()
                    if (ph, c, p) == (phase, callers, peer)
                ]
                for peer in PEERS
            }
            if not any(own.values()):
                continue
            pairs = [
                (r, by[(phase, callers, "powertools", r["run"])])
                for r in own["effectd"]
                if (phase, callers, "powertools", r["run"]) in by
            ]
            out.append(
                Row(
                    phase,
                    callers,
                    {p: Spread.of(r["calls_s"] for r in own[p]) for p in PEERS},
                    {p: Spread.of(r["p50_ms"] for r in own[p]) for p in PEERS},
                    {p: Spread.of(r["p99_ms"] for r in own[p]) for p in PEERS},
                    Spread.of(e["calls_s"] / t["calls_s"] for e, t in pairs),
                    Spread.of(e["p99_ms"] / t["p99_ms"] for e, t in pairs),
                )
            )
    return out


HEAD = (
    "phase",
    "callers",
    "effectd calls/s",
    "p50 ms",
    "p99 ms",
    "Powertools+Redis AOF calls/s",
    "p50 ms",
    "p99 ms",
    "ratio effectd/Powertools",
)


def table(table_rows: Sequence[Row], *, markdown: bool = False) -> str:
    """The comparison table: medians of the runs, calls/s and the ratio with
    their [min-max] over the runs."""
    lines: list[tuple[str, ...]] = [HEAD]
    for r in table_rows:
        lines.append(
            (
                "first" if r.phase == "first" else "duplicate",
                f"{r.callers} proc" + ("s" if r.callers > 1 else ""),
                r.calls_s["effectd"].show(",.0f"),
                r.p50_ms["effectd"].show(".2f", ranged=False),
                r.p99_ms["effectd"].show(".2f", ranged=False),
                r.calls_s["powertools"].show(",.0f"),
                r.p50_ms["powertools"].show(".2f", ranged=False),
                r.p99_ms["powertools"].show(".2f", ranged=False),
                r.ratio.show(".2f"),
            )
        )
    if markdown:
        cells = ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join([cells[0], "|" + "---|" * len(HEAD), *cells[1:]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEAD))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A goal of the performance issue, reported against the measured
    value, never asserted."""

    what: str
    value: float
    limit: float
    at_least: bool

    @property
    def met(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def show(self) -> str:
        if self.value != self.value:
            return f"{self.what}: not measured"
        sign = ">=" if self.at_least else "<="
        verdict = "met" if self.met else "MISSED"
        return f"{self.what}: {self.value:.2f} (target {sign} {self.limit:g}) {verdict}"


def _median(values: Iterable[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else float("nan")


def daemon_cpu(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """effectd's daemon CPU ms per call at 32 processes, by phase (median of
    the runs)."""
    return {
        phase: _median(
            r.get("server_cpu_ms", float("nan"))
            for r in records
            if r.get("valid")
            and r["peer"] == "effectd"
            and r["callers"] == 32
            and r["phase"] == phase
        )
        for phase in PHASES
    }


def cpu_table(records: Sequence[Mapping[str, Any]], *, markdown: bool = False) -> str:
    """CPU ms per call, medians of the runs: each peer's server and callers."""
    head = ("phase", "callers", "peer", "server CPU ms/call", "callers CPU ms/call")
    lines: list[tuple[str, ...]] = [head]
    for phase in PHASES:
        for callers in CALLERS:
            for peer in PEERS:
                own = [
                    r
                    for r in records
                    if r.get("valid")
                    and (r["phase"], r["callers"], r["peer"]) == (phase, callers, peer)
                ]
                if not own:
                    continue
                server = _median(r.get("server_cpu_ms", float("nan")) for r in own)
                caller = _median(r.get("caller_cpu_ms", float("nan")) for r in own)
                lines.append(
                    (
                        "first" if phase == "first" else "duplicate",
                        str(callers),
                        peer,
                        f"{server:.3f}",
                        f"{caller:.3f}",
                    )
                )
    if markdown:
        cells = ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join([cells[0], "|" + "---|" * len(head), *cells[1:]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def targets(
    table_rows: Sequence[Row],
    rss_idle_mb: float,
    rss_loaded_mb: float,
    cpu_ms: Mapping[str, float] | None = None,
) -> list[Target]:
    """The issue's targets, on the medians of the same-run ratios; `cpu_ms`:
    the daemon's CPU per call at 32 processes, by phase."""
    at = {(r.phase, r.callers): r for r in table_rows}
    nan = Spread.of(())

    def ratio(phase: str, callers: int) -> float:
        return (
            at[(phase, callers)].ratio.median if (phase, callers) in at else nan.median
        )

    def p99(phase: str) -> float:
        return at[(phase, 32)].p99_ratio.median if (phase, 32) in at else nan.median

    return [
        Target("first, 1 caller: calls/s ratio", ratio("first", 1), 0.55, True),
        Target("first, 32 procs: calls/s ratio", ratio("first", 32), 0.7, True),
        Target("duplicate, 1 caller: calls/s ratio", ratio("dup", 1), 1.0, True),
        Target("duplicate, 32 procs: calls/s ratio", ratio("dup", 32), 1.0, True),
        Target("first, 32 procs: p99 ratio", p99("first"), 2.0, False),
        Target("duplicate, 32 procs: p99 ratio", p99("dup"), 2.0, False),
        Target(
            "daemon CPU per first execution at 32 procs, ms",
            (cpu_ms or {}).get("first", nan.median),
            0.6,
            False,
        ),
        Target(
            "daemon CPU per duplicate at 32 procs, ms",
            (cpu_ms or {}).get("dup", nan.median),
            0.3,
            False,
        ),
        Target("daemon RSS idle, MB", rss_idle_mb, 60, False),
        Target("daemon RSS under 32 procs, MB", rss_loaded_mb, 150, False),
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """A py-spy profile summed up: shares of the samples, largest first."""

    samples: int
    threads: list[tuple[str, float]]
    self_time: list[tuple[str, float]]
    own_code: list[tuple[str, float]]  # total time of the daemon's functions


def top_frames(collapsed: Iterable[str], n: int = 15, own: str = "sidecar/") -> Profile:
    """Sums up py-spy's collapsed stacks ("thread;a;b;c count" per line, the
    thread first with --threads): each thread's share, the n frames with the
    most self time, and the n functions of the daemon (`own` in the frame)
    with the most total time."""
    threads: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        k = int(count)
        samples += k
        if frames[0].startswith("thread ("):
            threads[frames[0]] += k
        leaf[frames[-1]] += k
        for frame in set(frames):
            if own in frame:
                total[frame] += k

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, k / samples) for f, k in c.most_common(n)]

    if samples == 0:
        return Profile(0, [], [], [])
    return Profile(samples, share(threads), share(leaf), share(total))
