"""What a daemon loads at start: a library only one option needs is imported
when that option is on, so a daemon without it stays small (idle resident
memory, docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

LOADED = """
import sys
import sidecar.cli, sidecar.server
print(",".join(sorted(m for m in ("cryptography", "psycopg") if m in sys.modules)))
"""


def test_a_daemon_without_tls_or_postgres_does_not_load_their_libraries() -> None:
    """`cryptography` (about 9 MB resident) is imported with TLS on only
    (fails before: importing the TLS module loaded it), and the PostgreSQL
    driver with `--store` only (fails if the command line imports it)."""
    out = subprocess.run(
        [sys.executable, "-c", LOADED], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
