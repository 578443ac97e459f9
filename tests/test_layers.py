"""Imports run one way. Every module of the daemon (`sidecar`) and of the
Python client (`effectd_client`) is parsed, each import (also those inside
functions and under TYPE_CHECKING) is mapped to the unit it reaches, and the
pair is checked against `ALLOWED`: a unit imports only the units below it. A
new upward import fails here, naming the module, the line and the import.

A unit is a top-level module or subpackage of `sidecar` (`ledger`, `rpc`,
`errors`, ...); `sidecar` itself is its `__init__`. The client is two units to
the daemon: `effectd_client` (the public names of the package) and its private
modules (`effectd_client._*`), which only the client itself may import. The
client never imports the daemon, and its own modules import each other one way
(no cycle)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDECAR = ROOT / "sidecar"
CLIENT = ROOT / "clients" / "python" / "src" / "effectd_client"

CLIENT_PUBLIC = "effectd_client"
CLIENT_PRIVATE = "effectd_client._*"

# Stdlib-only leaves every layer may use.
BASE = frozenset(
    {
        "sidecar",
        "errors",
        "clock",
        "locking",
        "tracecontext",
        "tomlfields",
        "failpoints",
    }
)

# unit -> the units it may import (besides itself and anything outside effectd).
ALLOWED: Mapping[str, frozenset[str]] = {
    "sidecar": frozenset(),
    "errors": frozenset(),
    "clock": frozenset(),
    "locking": frozenset(),
    "tracecontext": frozenset(),
    # The typed fields of a TOML table, for every file the daemon reads.
    "tomlfields": frozenset(),
    # A test build's crash points in the stores' write paths.
    "failpoints": frozenset(),
    "probe": frozenset(),
    # Pure rules: records, transitions, quotas, policy.
    "ledger": BASE,
    "config": BASE | {"ledger"},
    "directories": BASE | {"config"},
    "settings": BASE | {"config", "ledger"},
    "policy_file": BASE | {"ledger"},
    "storage": BASE | {"ledger"},
    # Calls to upstreams: request validation limits from the ledger, the
    # client's public header rules.
    "provider": BASE | {"ledger", CLIENT_PUBLIC},
    "services": BASE | {"ledger", "storage", "config", "policy_file"},
    "auth": BASE | {"ledger", "config"},
    "callstate": BASE | {"auth"},
    "observability": BASE | {"ledger", "storage", "provider", "callstate"},
    "rpc": BASE
    | {
        "ledger",
        "config",
        "auth",
        "callstate",
        "observability",
        "provider",
        "services",
    },
    # The seams a daemon is constructed with; the tracer's type is the gate's.
    "seams": BASE | {"rpc"},
    # The store a daemon serves, opened from the configuration.
    "stores": BASE | {"config", "directories", "storage", "observability"},
    # The composition root: every service wired from the configuration and
    # the seams.
    "composition": BASE
    | {
        "stores",
        "ledger",
        "config",
        "directories",
        "policy_file",
        "storage",
        "provider",
        "services",
        "auth",
        "callstate",
        "observability",
        "rpc",
        "seams",
    },
    # The lifecycle: start and stop.
    "server": BASE
    | {
        "config",
        "directories",
        "storage",
        "services",
        "observability",
        "rpc",
        "seams",
        "stores",
        "composition",
    },
    # The operator's tool: a client of the daemon through the public client,
    # and the offline restore, which opens the store itself.
    "ctl": BASE | {"ledger", "storage", CLIENT_PUBLIC},
    # The people's console: a web client of the daemon through the public
    # client, sharing the operator tool's rendering of records.
    "web": BASE | {"ledger", "config", "ctl", CLIENT_PUBLIC},
    "cli": BASE
    | {
        "ledger",
        "config",
        "settings",
        "policy_file",
        "storage",
        "provider",
        "observability",
        "server",
        "ctl",
        "web",
    },
    "__main__": frozenset({"cli"}),
    "testing": BASE | {"config", "seams", "server"},
}


def module_name(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def known_modules() -> frozenset[str]:
    return frozenset(
        module_name(p, top) for top in (SIDECAR, CLIENT) for p in top.rglob("*.py")
    )


def imported(
    source: str, module: str, is_package: bool, modules: frozenset[str]
) -> Iterator[tuple[int, str]]:
    """(line, module imported) of every import in `source`; `from p import n`
    yields `p.n` when that is a module, else `p`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base.pop()
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                yield node.lineno, full if full in modules else target


def unit_of(name: str) -> str | None:
    """The unit `name` belongs to; None: not part of effectd."""
    parts = name.split(".")
    if parts[0] == "sidecar":
        return parts[1] if len(parts) > 1 else "sidecar"
    if parts[0] == "effectd_client":
        private = len(parts) > 1 and parts[1].startswith("_")
        return CLIENT_PRIVATE if private else CLIENT_PUBLIC
    return None


def upward_imports(
    source: str,
    module: str,
    *,
    is_package: bool = False,
    modules: frozenset[str] = frozenset(),
) -> list[str]:
    """The imports of daemon module `module` (text `source`) that `ALLOWED`
    does not allow, as 'module:line imports name'."""
    own = unit_of(module) or ""
    assert own in ALLOWED, f"{module}: no row in ALLOWED"
    found: list[str] = []
    for line, name in imported(source, module, is_package, modules):
        unit = unit_of(name)
        if unit is None or unit == own or unit in ALLOWED[own]:
            continue
        found.append(f"{module}:{line} imports {name}")
    return list(dict.fromkeys(found))


def sources(top: Path) -> Iterator[tuple[str, bool, str]]:
    for path in sorted(top.rglob("*.py")):
        yield module_name(path, top), path.name == "__init__.py", path.read_text()


def test_every_unit_has_a_row_and_the_table_has_no_cycle() -> None:
    units = {p.stem if p.is_file() else p.name for p in SIDECAR.iterdir()}
    units = {u for u in units if not u.startswith((".", "_")) or u == "__main__"}
    units.discard("py")  # py.typed
    units.add("sidecar")
    assert units - set(ALLOWED) == set()

    def below(unit: str, seen: tuple[str, ...]) -> None:
        assert unit not in seen, f"ALLOWED has a cycle: {' -> '.join((*seen, unit))}"
        for lower in ALLOWED.get(unit, frozenset()):
            below(lower, (*seen, unit))

    for unit in ALLOWED:
        below(unit, ())


def test_daemon_imports_run_down_the_table() -> None:
    modules = known_modules()
    found = [
        problem
        for module, is_package, text in sources(SIDECAR)
        for problem in upward_imports(
            text, module, is_package=is_package, modules=modules
        )
    ]
    assert found == []


def test_an_upward_import_is_reported() -> None:
    """The negative control: the same check on a ledger module that reaches up
    into the rpc layer, the client's private modules, or (relatively) the
    storage layer reports each import."""
    modules = known_modules()
    text = (
        "from sidecar.errors import NotFound\n"
        "from sidecar.rpc.gate import CallState\n"
        "from effectd_client._channel import Connection\n"
        "from ..storage import records\n"
        "def lazy():\n"
        "    import sidecar.server\n"
    )
    found = upward_imports(text, "sidecar.ledger.sneaky", modules=modules)
    assert found == [
        "sidecar.ledger.sneaky:2 imports sidecar.rpc.gate",
        "sidecar.ledger.sneaky:3 imports effectd_client._channel",
        "sidecar.ledger.sneaky:4 imports sidecar.storage.records",
        "sidecar.ledger.sneaky:6 imports sidecar.server",
    ]
    # `from sidecar import errors` reaches the errors module, not the package.
    assert upward_imports(
        "from sidecar import errors\n", "sidecar.clock", modules=modules
    ) == ["sidecar.clock:1 imports sidecar.errors"]


def test_the_client_never_imports_the_daemon_and_has_no_cycle() -> None:
    modules = known_modules()
    graph: dict[str, set[str]] = {}
    daemon = []
    for module, is_package, text in sources(CLIENT):
        for line, name in imported(text, module, is_package, modules):
            if name.split(".")[0] == "sidecar":
                daemon.append(f"{module}:{line} imports {name}")
            elif (
                name in modules and name.startswith("effectd_client") and name != module
            ):
                graph.setdefault(module, set()).add(name)
    assert daemon == []

    def walk(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        for dep in sorted(graph.get(module, ())):
            # The package imports its modules to re-export them; they may
            # import the package's siblings but never the package itself.
            walk(dep, (*path, module))

    for module in sorted(graph):
        if module != "effectd_client":
            walk(module, ())
