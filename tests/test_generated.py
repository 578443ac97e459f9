"""The committed generated code matches the .proto files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from scripts import gen_protos

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_is_fresh() -> None:
    """`make protos` would change nothing."""
    run = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr


def test_negative_control_stale_code_is_detected(tmp_path: Path) -> None:
    """An edited or missing generated file is reported as stale."""
    committed = ROOT / "clients" / "python" / "src" / "effectd"
    copy = tmp_path / "effectd"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "v1" / "ledger_pb2.py").write_text("# edited\n")
    (copy / "v1" / "errors_pb2.pyi").unlink()
    found = gen_protos.differences(committed, copy)
    assert "stale: v1/ledger_pb2.py" in found
    assert "missing: v1/errors_pb2.pyi" in found
