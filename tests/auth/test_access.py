"""The access rules' module holds no dead rule: every public function and
class of `sidecar.auth.access` is used somewhere in the daemon, so a check
that nothing calls cannot look like a guard."""

from __future__ import annotations

import ast
from pathlib import Path

from sidecar.auth import access

SIDECAR = Path(access.__file__).resolve().parents[1]


def public_names(source: str) -> set[str]:
    """The module-level functions and classes of `source` not named `_...`."""
    return {
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
        and not node.name.startswith("_")
    }


def unused(module: Path, others: list[str]) -> set[str]:
    """The public names of `module` that neither `module` nor any text of
    `others` uses (a definition is not a use)."""
    source = module.read_text()
    used = {
        name
        for text in [source, *others]
        for node in ast.walk(ast.parse(text))
        for name in (
            [node.id]
            if isinstance(node, ast.Name)
            else [node.attr]
            if isinstance(node, ast.Attribute)
            else [alias.name for alias in node.names]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    return public_names(source) - used


def _daemon_sources(but: Path) -> list[str]:
    return [p.read_text() for p in sorted(SIDECAR.rglob("*.py")) if p != but]


def test_every_public_name_of_the_access_rules_is_used() -> None:
    module = Path(access.__file__)
    assert {"authorize", "Principal", "bearer_token"} <= public_names(
        module.read_text()
    )
    assert unused(module, _daemon_sources(module)) == set()


def test_a_rule_nobody_calls_is_reported(tmp_path: Path) -> None:
    """The negative control: a planted function that no other module uses."""
    planted = tmp_path / "access.py"
    planted.write_text(
        Path(access.__file__).read_text()
        + "\n\ndef may_read_everything(principal: Principal) -> None:\n"
        "    raise PermissionDenied('no')\n"
    )
    module = Path(access.__file__)
    assert unused(planted, _daemon_sources(module)) == {"may_read_everything"}
