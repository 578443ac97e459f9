"""Imports run one way. Every module of the daemon (`sidecar`) and of the
Python client (`effectd_client`) is parsed, each import (also those inside
functions and under TYPE_CHECKING) is mapped to the unit it reaches, and the
pair is checked against `ALLOWED`: a unit imports only the units below it. A
new upward import fails here, naming the module, the line and the import.
`ALLOWED` is also the code's graph: an allowance no module uses fails too
(the leaves, which every unit may use, aside).

The layer table of docs/architecture.md says the same as `ALLOWED`: each of
its rows names its units and what they may import (`leaves` standing for
`BASE`), which must be exactly what `ALLOWED` allows them together; every
unit has one row, and no row imports from a row below it. So the page a new
engineer reads first cannot drift from the code.

A unit is a top-level module or subpackage of `sidecar` (`ledger`, `rpc`,
`errors`, ...); `sidecar` itself is its `__init__`. The client is two units to
the daemon: `effectd_client` (the public names of the package) and its private
modules (`effectd_client._*`), which only the client itself may import. The
client never imports the daemon, and its own modules import each other one way
(no cycle)."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = ROOT / "sidecar"
CLIENT = ROOT / "clients" / "python" / "src" / "effectd_client"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

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
        "sdnotify",
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
    # The service manager's readiness datagrams.
    "sdnotify": frozenset(),
    "probe": frozenset(),
    # Pure rules: records, transitions, quotas, policy.
    "ledger": BASE,
    # The configuration checks a store URL against the backends' registry
    # (`storage.backends`).
    "config": BASE | {"ledger", "storage"},
    "directories": BASE | {"config", "ledger"},
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
        "ledger",
        "config",
        "directories",
        "policy_file",
        "storage",
        "provider",
        "services",
        "auth",
        "observability",
        "rpc",
        "seams",
    },
    # The side ports beside the gRPC listeners (health, metrics), and the
    # line naming every listener.
    "side_ports": BASE | {"config", "observability", "composition"},
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
        "side_ports",
    },
    # The operator's tool: a client of the daemon through the public client,
    # and the offline restore, which opens the store itself.
    "ctl": BASE | {"ledger", "storage", CLIENT_PUBLIC},
    # The people's console: a web client of the daemon through the public
    # client, sharing the operator tool's rendering of records.
    "web": BASE | {"config", "ctl", CLIENT_PUBLIC},
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
        private = any(part.startswith("_") for part in parts[1:])
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


# The store backends, each a package of `sidecar.storage`: none imports
# another, and the backend-neutral part of `storage` imports none of them
# (`storage.backends` names them as text, imported when used).
BACKEND_PACKAGES = ("sidecar.storage.lmdb", "sidecar.storage.postgres")


def backend_of(name: str) -> str | None:
    for package in BACKEND_PACKAGES:
        if name == package or name.startswith(package + "."):
            return package
    return None


def crossing_imports(
    source: str,
    module: str,
    *,
    is_package: bool = False,
    modules: frozenset[str] = frozenset(),
) -> list[str]:
    """The imports of storage module `module` that reach a backend package
    other than its own (the neutral part has none of its own)."""
    own = backend_of(module)
    found = [
        f"{module}:{line} imports {name}"
        for line, name in imported(source, module, is_package, modules)
        if backend_of(name) not in (None, own)
    ]
    return list(dict.fromkeys(found))


def test_store_backends_import_neither_each_other_nor_from_the_neutral_part() -> None:
    modules = known_modules()
    found = [
        problem
        for module, is_package, text in sources(SIDECAR)
        if module.startswith("sidecar.storage")
        for problem in crossing_imports(
            text, module, is_package=is_package, modules=modules
        )
    ]
    assert found == []


def test_a_backend_reaching_into_another_is_reported() -> None:
    """The negative control: PostgreSQL's views taking an LMDB name, and a
    neutral module importing a backend, are each reported."""
    modules = known_modules()
    assert crossing_imports(
        "from sidecar.storage.lmdb.views import TxnView\n",
        "sidecar.storage.postgres.views",
        modules=modules,
    ) == ["sidecar.storage.postgres.views:1 imports sidecar.storage.lmdb.views"]
    assert crossing_imports(
        "from sidecar.storage.postgres import schema\n",
        "sidecar.storage.records",
        modules=modules,
    ) == ["sidecar.storage.records:1 imports sidecar.storage.postgres.schema"]


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


@functools.cache
def used_edges() -> Mapping[str, frozenset[str]]:
    """unit -> the other units the daemon's modules of that unit import."""
    modules = known_modules()
    edges: dict[str, set[str]] = {}
    for module, is_package, text in sources(SIDECAR):
        own = unit_of(module) or ""
        for _, name in imported(text, module, is_package, modules):
            unit = unit_of(name)
            if unit is not None and unit != own:
                edges.setdefault(own, set()).add(unit)
    return {unit: frozenset(units) for unit, units in edges.items()}


def unused_allowances(
    allowed: Mapping[str, frozenset[str]], edges: Mapping[str, frozenset[str]]
) -> list[str]:
    """'unit -> unit' for each allowance (but a leaf) no module makes."""
    return [
        f"{unit} -> {lower}"
        for unit, lowers in allowed.items()
        for lower in sorted(lowers - BASE - edges.get(unit, frozenset()))
    ]


def test_the_table_allows_only_imports_the_code_makes() -> None:
    assert unused_allowances(ALLOWED, used_edges()) == []


def test_an_allowance_nobody_uses_is_reported() -> None:
    """The negative control: the table with rpc allowed to import the
    server, which no rpc module does."""
    loose = {**ALLOWED, "rpc": ALLOWED["rpc"] | {"server"}}
    assert unused_allowances(loose, used_edges()) == ["rpc -> server"]


# -- the layer table of docs/architecture.md ------------------------------------

LEAVES = "leaves"
TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the layer table: its line, its units, what it may import."""

    line: int
    units: tuple[str, ...]
    may_import: frozenset[str]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


DAEMON_TABLE = "## The layers, bottom to top"


def layer_rows(text: str, heading: str = DAEMON_TABLE) -> list[Row]:
    """The rows of the table under `heading`."""
    lines = text.splitlines()
    start = lines.index(heading)
    rows: list[Row] = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = _cells(line)
        if set(cells[0]) <= set("-: ") or cells[0].startswith("layer"):
            continue
        units = tuple(u.rstrip("/") for u in TICKED.findall(cells[0]))
        may = {u.rstrip("/") for u in TICKED.findall(cells[-1])}
        if re.search(rf"\b{LEAVES}\b", cells[-1]):
            may |= BASE
        rows.append(Row(number, units, frozenset(may)))
    return rows


def _names(units: frozenset[str]) -> list[str]:
    """`units` for a message, the leaves as one word when all are there."""
    if units >= BASE:
        return [LEAVES, *(f"`{u}`" for u in sorted(units - BASE))]
    return [f"`{u}`" for u in sorted(units)]


def table_problems(rows: list[Row], allowed: Mapping[str, frozenset[str]]) -> list[str]:
    """Where the table and `allowed` disagree, each naming the table's line."""
    found: list[str] = []
    placed: dict[str, int] = {}
    for index, row in enumerate(rows):
        for unit in row.units:
            if unit not in allowed:
                found.append(f"line {row.line}: `{unit}` is no unit of ALLOWED")
            elif unit in placed:
                found.append(f"line {row.line}: `{unit}` has a row already")
            else:
                placed[unit] = index
        expected = frozenset().union(*(allowed.get(u, frozenset()) for u in row.units))
        for name in _names(row.may_import - expected):
            found.append(f"line {row.line}: may import {name}, ALLOWED says not")
        for name in _names(expected - row.may_import):
            found.append(f"line {row.line}: ALLOWED lets it import {name}")
    for index, row in enumerate(rows):
        for name in sorted(row.may_import):
            if placed.get(name, -1) > index:
                found.append(f"line {row.line}: imports `{name}`, a row below it")
    found += [f"`{u}` has no row in the table" for u in allowed if u not in placed]
    return found


def test_the_architecture_table_says_what_allowed_says() -> None:
    rows = layer_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(rows) > 10
    problems = table_problems(rows, ALLOWED)
    assert not problems, "docs/architecture.md, the layer table:\n" + "\n".join(
        problems
    )


def test_a_table_that_drifted_is_reported() -> None:
    """The negative control: the table as it was when it said observability
    imported the layers above services, with web put below ctl and the
    leaves row without `failpoints`."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    observability = next(
        line for line in text.splitlines() if line.startswith("| `observability/`")
    )
    drifted = text.replace(
        observability,
        "| `observability/` | metrics | the layers above `services` except `rpc` |",
    )
    web = next(line for line in text.splitlines() if line.startswith("| `web/`"))
    ctl = next(line for line in text.splitlines() if line.startswith("| `ctl/`"))
    drifted = drifted.replace(web, "WEB").replace(ctl, web).replace("WEB", ctl)
    drifted = drifted.replace("`tomlfields`, `failpoints` |", "`tomlfields` |")
    rows = layer_rows(drifted)
    line = {unit: row.line for row in rows for unit in row.units}
    assert table_problems(rows, ALLOWED) == [
        f"line {line['observability']}: may import `rpc`, ALLOWED says not",
        f"line {line['observability']}: may import `services`, ALLOWED says not",
        f"line {line['observability']}: ALLOWED lets it import leaves",
        f"line {line['observability']}: ALLOWED lets it import `callstate`",
        f"line {line['observability']}: ALLOWED lets it import `ledger`",
        f"line {line['observability']}: ALLOWED lets it import `provider`",
        f"line {line['observability']}: ALLOWED lets it import `storage`",
        f"line {line['observability']}: imports `rpc`, a row below it",
        f"line {line['web']}: imports `ctl`, a row below it",
        "`failpoints` has no row in the table",
    ]


# -- the client's layers ------------------------------------------------------------

CLIENT_TABLE = "## The client's layers, bottom to top"
CLIENT_CONTRIB = "effectd_client.contrib"
# The adapters' first import paths, each a unit re-exporting its package.
OLD_PATHS = tuple(
    f"effectd_client.{name}"
    for name in ("langgraph", "mcp", "openai_agents", "pydantic_ai")
)

# unit -> the units it may import (besides itself and anything outside effectd).
CLIENT_ALLOWED: Mapping[str, frozenset[str]] = {
    # The core: the public names and the private modules behind them.
    CLIENT_PRIVATE: frozenset({CLIENT_PUBLIC}),
    CLIENT_PUBLIC: frozenset({CLIENT_PRIVATE}),
    # The adapters: the public names and `effectd_client.extend` only.
    CLIENT_CONTRIB: frozenset({CLIENT_PUBLIC}),
    **{old: frozenset({CLIENT_CONTRIB}) for old in OLD_PATHS},
}


def client_unit(name: str) -> str | None:
    """The client's unit `name` belongs to; None: not part of the client."""
    parts = name.split(".")
    if parts[0] != "effectd_client":
        return None
    if len(parts) > 1 and parts[1] == "contrib":
        return CLIENT_CONTRIB
    if ".".join(parts[:2]) in OLD_PATHS:
        return ".".join(parts[:2])
    return unit_of(name)


def adapter_of(name: str) -> str | None:
    """The adapter package `name` is part of (None: no adapter's)."""
    parts = name.split(".")
    if parts[:2] == ["effectd_client", "contrib"] and len(parts) > 2:
        return ".".join(parts[:3])
    return None


def client_problems(
    source: str,
    module: str,
    *,
    is_package: bool = False,
    modules: frozenset[str] = frozenset(),
) -> list[str]:
    """The imports of client module `module` that `CLIENT_ALLOWED` does not
    allow, and those of an adapter reaching into another adapter's package."""
    own = client_unit(module) or ""
    assert own in CLIENT_ALLOWED, f"{module}: no row in CLIENT_ALLOWED"
    found: list[str] = []
    for line, name in imported(source, module, is_package, modules):
        unit = client_unit(name)
        if unit is None:
            continue
        if unit != own and unit not in CLIENT_ALLOWED[own]:
            found.append(f"{module}:{line} imports {name}")
        elif own == CLIENT_CONTRIB and adapter_of(name) not in (
            None,
            adapter_of(module),
        ):
            found.append(f"{module}:{line} imports {name}, another adapter's")
    return list(dict.fromkeys(found))


def test_client_imports_run_down_its_table() -> None:
    modules = known_modules()
    found = [
        problem
        for module, is_package, text in sources(CLIENT)
        for problem in client_problems(
            text, module, is_package=is_package, modules=modules
        )
    ]
    assert found == []


def test_an_adapter_importing_a_private_module_is_reported() -> None:
    """The negative control: LangGraph's step as it was before the extension
    surface (the safe call's judgement from `_safe_base`), with a planted
    `from effectd_client import _aio`, an adapter reaching into another's
    package, a private module of the core importing an adapter, and an old
    path importing the core, are each reported."""
    modules = known_modules()
    step = CLIENT / "contrib" / "langgraph" / "_step.py"
    text = step.read_text().replace(
        "from effectd_client.extend import admit, asks_for_retry\n",
        "from effectd_client._safe_base import admit, asks_for_retry\n"
        "from effectd_client import _aio\n",
    )
    module = "effectd_client.contrib.langgraph._step"
    found = client_problems(text, module, modules=modules)
    line = text.splitlines().index(
        "from effectd_client._safe_base import admit, asks_for_retry"
    )
    assert found == [
        f"{module}:{line + 1} imports effectd_client._safe_base",
        f"{module}:{line + 2} imports effectd_client._aio",
    ]
    assert client_problems(
        "from effectd_client.contrib.mcp import McpPolicy\n",
        "effectd_client.contrib.openai_agents",
        is_package=True,
        modules=modules,
    ) == [
        "effectd_client.contrib.openai_agents:1 imports "
        "effectd_client.contrib.mcp, another adapter's"
    ]
    assert (
        client_problems(
            "from .mcp import McpPolicy\n", "effectd_client.contrib.openai_agents._mcp"
        )
        == []
    )  # its own private module
    assert client_problems(
        "def lazy():\n    from effectd_client.contrib.langgraph import approve\n",
        "effectd_client._safe",
        modules=modules,
    ) == ["effectd_client._safe:2 imports effectd_client.contrib.langgraph"]
    assert client_problems(
        "from effectd_client import Client\n", "effectd_client.mcp", modules=modules
    ) == ["effectd_client.mcp:1 imports effectd_client"]


def test_the_client_table_allows_only_imports_the_code_makes() -> None:
    modules = known_modules()
    edges: dict[str, set[str]] = {}
    for module, is_package, text in sources(CLIENT):
        own = client_unit(module) or ""
        for _, name in imported(text, module, is_package, modules):
            unit = client_unit(name)
            if unit is not None and unit != own:
                edges.setdefault(own, set()).add(unit)
    used = {unit: frozenset(units) for unit, units in edges.items()}
    assert unused_allowances(CLIENT_ALLOWED, used) == []


def test_the_architecture_client_table_says_what_client_allowed_says() -> None:
    rows = layer_rows(ARCHITECTURE.read_text(encoding="utf-8"), CLIENT_TABLE)
    problems = table_problems(rows, CLIENT_ALLOWED)
    assert not problems, "docs/architecture.md, the client's table:\n" + "\n".join(
        problems
    )


def test_a_client_table_that_drifted_is_reported() -> None:
    """The negative control: the client's table saying the adapters may
    import the private modules, and without the old paths' row."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    contrib = next(
        line
        for line in text.splitlines()
        if line.startswith("| `effectd_client.contrib`")
    )
    olds = next(
        line
        for line in text.splitlines()
        if line.startswith("| `effectd_client.langgraph`")
    )
    cells = contrib.rsplit("|", 2)
    drifted = text.replace(
        contrib, f"{cells[0]}| `effectd_client`, `effectd_client._*` |"
    ).replace(olds + "\n", "")
    rows = layer_rows(drifted, CLIENT_TABLE)
    line = {unit: row.line for row in rows for unit in row.units}
    assert table_problems(rows, CLIENT_ALLOWED) == [
        f"line {line[CLIENT_CONTRIB]}: may import `{CLIENT_PRIVATE}`, ALLOWED says not",
        *(f"`{old}` has no row in the table" for old in OLD_PATHS),
    ]
