"""The conformance table: each test records its verdict (`record_property`);
the controller gathers them from every worker's reports and prints the table
adapter x scenario at the end of the run."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

_VERDICTS: dict[str, dict[tuple[str, str], str]] = defaultdict(dict)
_ID = re.compile(r"\[(?P<adapter>[a-z_]+)-(?P<scenario>[a-z_0-9]+)\]$")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    match = _ID.search(report.nodeid)
    if "tests/adapters/" not in report.nodeid or match is None:
        return
    key = (match["adapter"], match["scenario"])
    kind = "control" if "negative_control" in report.nodeid else "conformance"
    if report.when == "call" or report.failed:
        recorded = dict(report.user_properties).get(kind)
        verdict = str(recorded) if report.passed and recorded else report.outcome
        _VERDICTS[kind].setdefault(key, verdict)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _VERDICTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("adapter conformance")
    for kind in ("conformance", "control"):
        verdicts = _VERDICTS.get(kind, {})
        for adapter in sorted({a for a, _ in verdicts}):
            write(f"{kind} — {adapter}")
            for (a, scenario), verdict in sorted(verdicts.items()):
                if a == adapter:
                    write(f"  {scenario:<22} {verdict}")
