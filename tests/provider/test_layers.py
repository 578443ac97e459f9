"""How the provider proxy is cut: small modules, observability reading only
the observer interface, and a gRPC boundary that only translates."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SIDECAR = Path(__file__).resolve().parents[2] / "sidecar"
MAX_LINES = 400


def _imports(path: Path) -> set[str]:
    """Every module `path` imports from, and each `module.name` it names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize(
    "path", sorted((SIDECAR / "provider").glob("*.py")), ids=lambda p: p.name
)
def test_provider_modules_stay_small(path: Path) -> None:
    """No module of the provider package passes 400 lines (issue 11 item 2:
    fails before the fix: client.py held the whole client in 791)."""
    assert len(path.read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize(
    "path", sorted((SIDECAR / "observability").glob("*.py")), ids=lambda p: p.name
)
def test_observability_reads_only_the_observer_interface(path: Path) -> None:
    """Observability imports nothing of the provider package but its
    observer interface (issue 11 item 2: fails before the fix: collectors
    imported the client's counters, the budget and the routes)."""
    provider = {
        m
        for m in _imports(path)
        if m.startswith("sidecar.provider") and m.count(".") == 2
    }
    assert provider <= {"sidecar.provider.observer"}


def test_the_grpc_boundary_only_translates() -> None:
    """`rpc/provider.py` neither looks a route up nor applies header rules:
    the provider does both, once (issue 11 item 2: fails before the fix:
    the servicer read the client's routes and the forbidden headers)."""
    path = SIDECAR / "rpc" / "provider.py"
    tree = ast.parse(path.read_text())
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "routes" not in attributes
    imported = _imports(path)
    assert not any(m.startswith("sidecar.provider.routes") for m in imported)
    assert not any(m.startswith("sidecar.provider.prepare") for m in imported)
    assert not any("HEADERS" in m for m in imported)
