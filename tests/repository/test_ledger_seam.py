"""The services speak to the store in the ledger's terms (`api.LedgerReads`,
`api.LedgerWrites`), never in its tables: no service imports `api.Table` or
the tables' protocols, nor a module that lays the ledger out on them (the
codecs of records, tombstones, usage, registrations, the restore marking,
the retention index), nor a backend. So a store is free to keep the ledger
its own way (PostgreSQL's typed rows, `storage.postgres.call_reads`), and a
new backend implements the ledger's operations, not twelve tables of bytes.

What a service may take from `storage`: the seam (`api`, bar the tables),
where identities are (`keys`: keys and the prefixes of walks, handed back
as places), the plan rows the gRPC boundary makes (`plan_rows`), long reads
off the loop (`scans`), the compare-and-swap of a call over the ledger's
operations (`calls`), and the view with nothing to read (`table_ledger`'s
`NO_READS`)."""

from __future__ import annotations

import ast

from tests.repository.test_layers import SIDECAR, imported, known_modules, sources

ALLOWED_MODULES = frozenset(
    {
        "sidecar.storage.api",
        "sidecar.storage.keys",
        "sidecar.storage.plan_rows",
        "sidecar.storage.scans",
        "sidecar.storage.calls",
        "sidecar.storage.table_ledger",
    }
)
# Names of those modules a service must not use: the tables, what only a
# view over tables is, and the views that hold both (a service types its
# functions on `LedgerReads` and `LedgerWrites`, so that strict typing
# refuses a table read in one).
TABLE_NAMES = frozenset(
    {
        "Table",
        "Tables",
        "WritableTables",
        "TableLedger",
        "TableLedgerReads",
        "ReadView",
        "WriteView",
    }
)


def table_uses(source: str, module: str, modules: frozenset[str]) -> list[str]:
    """What service module `module` (text `source`) takes of the store's
    tables, as 'module:line name'."""
    found = [
        f"{module}:{line} imports {name}"
        for line, name in imported(source, module, False, modules)
        if name.startswith("sidecar.storage") and name not in ALLOWED_MODULES
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "sidecar.storage"
        ):
            found += [
                f"{module}:{node.lineno} imports {alias.name}"
                for alias in node.names
                if alias.name in TABLE_NAMES
            ]
    return found


def test_no_service_reads_or_writes_the_tables() -> None:
    modules = known_modules()
    found = [
        problem
        for module, _, text in sources(SIDECAR)
        if module.startswith("sidecar.services")
        for problem in table_uses(text, module, modules)
    ]
    assert found == []


def test_a_service_reaching_for_the_tables_is_reported() -> None:
    """The negative control: a service taking `Table`, a codec module, or a
    backend is each reported."""
    modules = known_modules()
    module = "sidecar.services.ledger"
    assert table_uses(
        "from sidecar.storage.api import LedgerReads, Table\n", module, modules
    ) == [f"{module}:1 imports Table"]
    assert table_uses("from sidecar.storage import records\n", module, modules) == [
        f"{module}:1 imports sidecar.storage.records"
    ]
    assert table_uses(
        "from sidecar.storage.postgres import views\n", module, modules
    ) == [f"{module}:1 imports sidecar.storage.postgres.views"]
