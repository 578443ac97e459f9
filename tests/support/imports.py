"""What a fresh interpreter imports: the probe behind the tests that an
optional framework is imported only by its own adapter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable


def imported_by(statement: str, packages: Iterable[str]) -> list[str]:
    """Which of `packages` are in `sys.modules` after a new interpreter runs
    `statement` (sorted)."""
    names = sorted(set(packages))
    probe = (
        f"{statement}\nimport sys\nprint(*(m for m in {names!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    return out.stdout.split()
