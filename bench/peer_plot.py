"""Plots a peer comparison's results (`bench/peers.py` writes results.json).

    <bench venv>/bin/python bench/peer_plot.py results.json peers.png

Runs under the bench venv, which has matplotlib; the project's dependencies
do not. Left: calls/s of both peers per phase and caller count (median bar,
min-max whisker over the runs). Right: p50 and p99 per call (medians).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import peer_stats

COLOURS = {"effectd": "#2b6cb0", "powertools": "#dd6b20"}
LABELS = {
    "effectd": "effectd (LMDB, fsync)",
    "powertools": "Powertools + Redis AOF always",
}


def main(argv: list[str]) -> int:
    results, output = Path(argv[0]), Path(argv[1])
    data = json.loads(results.read_text())
    rows = peer_stats.rows(data["records"])
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [
        f"{'first' if r.phase == 'first' else 'duplicate'}\n{r.callers} "
        f"caller{'s' if r.callers > 1 else ''}"
        for r in rows
    ]
    width = 0.38
    for k, peer in enumerate(peer_stats.PEERS):
        xs = [i + (k - 0.5) * width for i in range(len(rows))]
        spreads = [r.calls_s[peer] for r in rows]
        left.bar(
            xs,
            [s.median for s in spreads],
            width,
            yerr=[
                [s.median - s.low for s in spreads],
                [s.high - s.median for s in spreads],
            ],
            capsize=3,
            color=COLOURS[peer],
            label=LABELS[peer],
        )
        for x, r in zip(xs, rows, strict=True):
            if k == 0:
                left.annotate(
                    f"{r.ratio.median:.2f}x",
                    (x + width / 2, max(s.median for s in r.calls_s.values())),
                    textcoords="offset points",
                    xytext=(0, 8),
                    ha="center",
                    fontsize=8,
                )
        right.bar(
            [x - width / 4 for x in xs],
            [r.p50_ms[peer].median for r in rows],
            width / 2,
            color=COLOURS[peer],
            label=f"{peer} p50",
        )
        right.bar(
            [x + width / 4 for x in xs],
            [r.p99_ms[peer].median for r in rows],
            width / 2,
            color=COLOURS[peer],
            alpha=0.45,
            label=f"{peer} p99",
        )
    for ax in (left, right):
        ax.set_xticks(range(len(rows)), names)
        ax.grid(axis="y", alpha=0.3)
    left.set_ylabel("calls/s (median, min-max of the runs)")
    left.set_title(
        "throughput; label: same-run ratio effectd / Powertools", fontsize=10
    )
    left.legend(fontsize=8, loc="upper left")
    left.margins(y=0.15)
    right.set_yscale("log")
    right.set_ylabel("ms per call (median of the runs)")
    right.set_title("latency p50 (solid) and p99 (light)", fontsize=10)
    right.legend(fontsize=8, loc="upper left")
    meta = data["meta"]
    fig.suptitle(
        f"effectd vs Powertools idempotency on Redis (AOF, appendfsync always), "
        f"{meta['runs']} interleaved runs",
        fontsize=11,
    )
    low, high = meta["load"]
    about = f"{meta['machine']}; 1-min load average {low:.1f} to {high:.1f}"
    fig.text(0.5, 0.005, about, ha="center", fontsize=7, color="#555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
