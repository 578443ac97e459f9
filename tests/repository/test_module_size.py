"""Modules stay small enough to read in one sitting: a module of the daemon
or of the Python client longer than `LIMIT` lines says at its top, in its
docstring, why it is long "on purpose". Generated protobuf code is exempt."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = (ROOT / "sidecar", ROOT / "clients" / "python" / "src" / "effectd_client")
LIMIT = 400
REASON = "on purpose"


def overlong(paths: list[Path], root: Path = ROOT) -> list[str]:
    """The modules among `paths` over `LIMIT` lines with no reason at the top."""
    found = []
    for path in paths:
        source = path.read_text()
        lines = source.count("\n")
        if lines <= LIMIT:
            continue
        docstring = ast.get_docstring(ast.parse(source)) or ""
        if REASON not in docstring:
            found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_every_long_module_says_why() -> None:
    paths = sorted(p for tree in TREES for p in tree.rglob("*.py"))
    assert paths
    assert overlong(paths) == []


def test_a_long_module_without_a_reason_is_found(tmp_path: Path) -> None:
    """The negative control: the same check finds a long module with no
    reason, and accepts it once its docstring gives one."""
    module = tmp_path / "long.py"
    body = "\n".join(f"x{i} = {i}" for i in range(LIMIT + 1))
    module.write_text(f'"""A module."""\n{body}\n')
    assert overlong([module], tmp_path) == [f"long.py: {LIMIT + 2} lines"]
    module.write_text(f'"""A module, long {REASON}: a table."""\n{body}\n')
    assert overlong([module], tmp_path) == []
