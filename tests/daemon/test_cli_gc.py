"""The daemon run as a program keeps its start-up objects out of the cyclic
garbage collector's full passes (`gc.freeze`), which otherwise walked them
all with the event loop stopped: the longest pause a message saw under load.
(Run in a test's own process, by `main(argv)`, it leaves the collector as it
is: a test process's garbage would never be collected.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Runs the daemon as the program (`cli.main()`, no arguments given), and
# once its socket is up reports how many objects the collector keeps frozen.
_PROBE = """
import gc, os, signal, sys, threading, time
from pathlib import Path
from sidecar import cli

socket = Path(sys.argv[1]) / "effectd.sock"

def report() -> None:
    for _ in range(1200):
        if socket.exists():
            break
        time.sleep(0.05)
    time.sleep(0.5)
    print("frozen", gc.get_freeze_count(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=report, daemon=True).start()
sys.argv = ["effectd", "serve", "--data-dir", sys.argv[1], "--init"]
raise SystemExit(cli.main())
"""


def _frozen(data: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("frozen ")]
    assert lines, done.stdout
    return int(lines[-1].split()[1])


def test_the_program_freezes_its_start_up_objects(short_tmp: Path) -> None:
    """Fails before: nothing was frozen, and a full pass walked ~45,000
    start-up objects (20-120 ms measured under load)."""
    assert _frozen(short_tmp / "data") > 10_000
