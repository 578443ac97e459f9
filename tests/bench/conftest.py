"""The benchmarks are scripts, not a package: their directory goes on the
import path, so that a test imports a script's pure helpers by the name the
scripts themselves use."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
