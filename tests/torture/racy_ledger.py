"""BROKEN on purpose: a daemon whose PrepareTool and StartTool read the
record outside the write transaction and write blindly
(`tests.support.race.RacyLedger`), so two clients may both hold the same
call's attempt. The linearizability test must reject its histories.

Run as `python -m tests.torture.racy_ledger serve --data-dir D`.
"""

from __future__ import annotations

from sidecar import cli
from tests.support.race import RacyDaemon

if __name__ == "__main__":
    raise SystemExit(cli.main(daemon_class=RacyDaemon))
