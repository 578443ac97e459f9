"""Plots effectd's calls/s and p99 against daemons on one PostgreSQL at 32
callers, beside DBOS at 16 callers (`bench/versus_dbos.py --plot` writes
the medians it reads).

    <bench venv>/bin/python bench/shared_plot.py shared.json shared.png

Runs under the bench venv, which has matplotlib; the project's dependencies
do not.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    data = json.loads(Path(argv[0]).read_text())
    output = Path(argv[1])
    scale = sorted(
        (int(str(p["point"]).split()[1].rstrip("d")), p)
        for p in data["points"]
        if p["phase"] == "scale"
    )
    dbos = [
        p
        for p in data["points"]
        if p["point"] == "DBOS" and p["phase"] == "first" and p["callers"] == 16
    ]
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    daemons = [d for d, _ in scale]
    rates = [p["ops_s"] for _, p in scale]
    low = [r - min(p["ops_s_rounds"]) for r, (_, p) in zip(rates, scale, strict=True)]
    high = [max(p["ops_s_rounds"]) - r for r, (_, p) in zip(rates, scale, strict=True)]
    left.errorbar(
        daemons,
        rates,
        yerr=[low, high],
        marker="o",
        capsize=4,
        color="#2b6cb0",
        label="effectd, 32 callers (median, min-max of rounds)",
    )
    if dbos:
        left.axhline(
            dbos[0]["ops_s"],
            color="#dd6b20",
            linestyle="--",
            label="DBOS Transact, 16 callers",
        )
    left.set_xlabel("effectd daemons on one PostgreSQL")
    left.set_ylabel("first executions / s")
    left.set_xticks(daemons)
    left.set_ylim(bottom=0)
    left.legend(fontsize=8)
    left.set_title("Throughput")
    right.plot(daemons, [p["p50"] for _, p in scale], marker="o", label="p50")
    right.plot(daemons, [p["p99"] for _, p in scale], marker="o", label="p99")
    right.set_xlabel("effectd daemons on one PostgreSQL")
    right.set_ylabel("ms per call")
    right.set_xticks(daemons)
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    right.set_title("Latency, 32 callers")
    fig.suptitle("effectd on one PostgreSQL 15, 2 cores (bench/versus_dbos.py)")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
