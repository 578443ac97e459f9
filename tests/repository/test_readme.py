"""The README's Python examples run as written against a real daemon."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config import ServeConfig
from sidecar.testing import running_daemon

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOCKET = "unix:.effectd/effectd.sock"


def _python_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"\.venv/bin/python - <<'PY'\n(.*?)\nPY\n", text, re.S)


def test_the_readme_has_python_examples() -> None:
    """The examples below are found, so the next test cannot pass vacuously."""
    examples = _python_examples()
    assert len(examples) >= 3
    assert all(SOCKET in e for e in examples)


# An example that hangs prints every thread's stack before it is stopped, so
# that a hang seen once is a hang that can be read.
_WATCHDOG = "import faulthandler; faulthandler.dump_traceback_later(25, exit=True)\n"


@pytest.mark.timeout(120)
def test_python_examples_run_in_order(short_tmp: Path) -> None:
    """Each example exits 0 against one daemon; the quickstart prints what the
    README says it prints, the first time and when run again."""
    config = ServeConfig(data_dir=short_tmp / ".effectd", init=True)
    outputs = []
    with running_daemon(config):
        for code in [*_python_examples(), _python_examples()[0]]:
            run = subprocess.run(
                [sys.executable, "-u", "-"],
                input=_WATCHDOG + code,
                cwd=short_tmp,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert run.returncode == 0, run.stdout + run.stderr
            outputs.append(run.stdout)
    assert "first prepare: EXECUTE" in outputs[0]
    assert "repeated prepare: RETURN_RESULT {'message_id': 'm-42'}" in outputs[0]
    assert "first prepare: RETURN_RESULT" in outputs[-1]
    safe = next(o for o in outputs if "time(s)" in o)
    assert safe.splitlines()[-1] == "{'message_id': 'm-1'} sent 1 time(s)"
