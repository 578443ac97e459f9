"""What one call costs the shared PostgreSQL store, counted, not timed.

One daemon on a database of its own (created on the server of
EFFECTD_BENCH_POSTGRES, default postgresql://127.0.0.1:5432/test, and
dropped after), one caller: CALLS first executions (PrepareTool(start) then
CommitTool(acknowledge)), then as many duplicates (PrepareTool of a committed
call). For each phase, per call: the write commits and read-only
transactions of the database (`pg_stat_database`), the statements its
connections sent (the server's log, with `log_statement` set on this
database only: needs a superuser and a readable server log, else n/a), the
WAL bytes of this database (`pg_walinspect`: records of its relations and
the commit records of its transactions), and the CPU milliseconds of the
daemon and of its database backends (/proc). Counts are steady where a
throughput on a shared machine is not.

    python bench/pg_cost.py [--calls 300] [--log /var/log/postgresql/...]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import psycopg
from effectd.v1 import ledger_pb2 as pb
from effectd.v1 import ledger_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from databases import scratch, url_of
from lifecycle import _daemon

from sidecar.storage.postgres import schema

SERVER = os.environ.get("EFFECTD_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
_TICK = os.sysconf("SC_CLK_TCK")
# A statement in the server's log: `[pid] user@database LOG:  statement: ...`
# (the simple protocol) or `... LOG:  execute name: ...` (the extended one).
_STATEMENT = re.compile(r"\[\d+\] \S*@(\S+) LOG:  (?:statement|execute [^:]*):")


@contextmanager
def wal_kept(admin: psycopg.Connection[tuple[object, ...]]) -> Iterator[None]:
    """The server keeps its WAL from now on until exit (a temporary physical
    replication slot), so that `Probe.wal` can read what a phase wrote even
    after checkpoints of other work."""
    slot = f"effectd_bench_{secrets.token_hex(4)}"
    admin.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
    try:
        yield
    finally:
        admin.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def _cpu_ms(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000 / _TICK


def _url(database: str) -> str:
    return url_of(SERVER, database)


class Probe:
    """Marks of the database's counters, read from an admin connection."""

    def __init__(
        self,
        admin: psycopg.Connection[tuple[object, ...]],
        db: str,
        own: psycopg.Connection[tuple[object, ...]],
        application: str = "effectd",
    ) -> None:
        self.admin = admin
        self.db = db
        # The application name the counted connections' starts with ("": all).
        self.application = application
        # A connection to the database itself, where pg_walinspect is.
        self.own = own
        row = admin.execute(
            "SELECT oid FROM pg_database WHERE datname = %s", (db,)
        ).fetchone()
        assert row is not None
        self.oid = int(str(row[0]))

    def backends(self) -> list[int]:
        """The server processes of the database's connections whose
        application name starts with `application` ("": every one but the
        probe's own)."""
        rows = self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s "
            "AND starts_with(application_name, %s) AND pid <> %s",
            (self.db, self.application, self.own.info.backend_pid),
        ).fetchall()
        return [int(str(r[0])) for r in rows]

    def mark(self) -> dict[str, object]:
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        row = self.admin.execute(
            "SELECT xact_commit, xact_rollback, pg_current_wal_flush_lsn()::text "
            "FROM pg_stat_database WHERE datname = %s",
            (self.db,),
        ).fetchone()
        assert row is not None
        return {"commit": int(str(row[0])), "rollback": int(str(row[1])), "lsn": row[2]}

    def wal(self, start: object, end: object) -> tuple[int, int]:
        """(WAL bytes of this database's relations and commits, write
        commits) between two LSNs; none when they are one (nothing was
        written between them, which pg_walinspect refuses to read)."""
        if start == end:
            return 0, 0
        for tries in range(40):
            try:
                rows = self.own.execute(
                    "SELECT xid, resource_manager, record_type, record_length, "
                    "fpi_length, block_ref FROM pg_get_wal_records_info("
                    "%s::pg_lsn, %s::pg_lsn)",
                    (start, end),
                ).fetchall()
                break
            except psycopg.errors.InvalidParameterValue:
                # "cannot accept future start LSN": now and then the server
                # says its flushed WAL ends before an LSN it gave as
                # flushed; it catches up.
                if tries == 39:
                    raise
                time.sleep(0.05)
        mine: set[object] = set()
        total = 0
        for xid, _rm, _rt, length, _fpi, refs in rows:
            if refs and f"/{self.oid}/" in str(refs):
                mine.add(xid)
                total += int(str(length))
        commits = 0
        for xid, rm, rt, length, _fpi, _refs in rows:
            if rm == "Transaction" and str(rt).startswith("COMMIT") and xid in mine:
                total += int(str(length))
                commits += 1
        return total, commits


async def _first(stub: Any, run: str, i: int) -> None:
    ref = pb.CallRef(run_id=run, call_id=str(i))
    started = await stub.PrepareTool(
        pb.PrepareToolRequest(
            ref=ref, tool_name="t", input=pb.Payload(json='{"a":1}'), start=True
        )
    )
    await stub.CommitTool(
        pb.CommitToolRequest(
            ref=ref,
            attempt=started.call.attempt,
            result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}")),
            acknowledge=True,
        )
    )


async def _dup(stub: Any, run: str, i: int) -> None:
    ref = pb.CallRef(run_id=run, call_id=str(i))
    await stub.PrepareTool(
        pb.PrepareToolRequest(
            ref=ref, tool_name="t", input=pb.Payload(json='{"a":1}'), start=True
        )
    )


async def _phase(target: str, run: str, calls: int, dup: bool) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ledger_pb2_grpc.ToolLedgerStub(channel)
        for i in range(calls):
            await (_dup if dup else _first)(stub, run, i)


def _count_statements(log: Path | None, offset: int, database: str) -> int | None:
    if log is None:
        return None
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return sum(1 for m in _STATEMENT.finditer(text) if m.group(1) == database)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("flags", nargs="*", help="more `effectd serve` flags")
    args = parser.parse_args()
    found = sorted(glob.glob("/var/log/postgresql/postgresql-*-main.log"))
    log: Path | None = args.log or (Path(found[-1]) if found else None)
    if log is not None and not os.access(log, os.R_OK):
        log = None
    with (
        scratch(SERVER, "effectd_cost") as name,
        psycopg.connect(SERVER, autocommit=True) as admin,
    ):
        with psycopg.connect(_url(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        if log is not None:
            admin.execute(f"ALTER DATABASE \"{name}\" SET log_statement = 'all'")
        schema.migrate_url(_url(name))
        with wal_kept(admin):
            _measure(admin, name, log, args.calls, args.flags)
    return 0


def _measure(
    admin: psycopg.Connection[tuple[object, ...]],
    name: str,
    log: Path | None,
    calls: int,
    flags: list[str],
) -> None:
    with psycopg.connect(_url(name), autocommit=True) as own:
        _measure_with(Probe(admin, name, own), log, calls, flags)


def _measure_with(probe: Probe, log: Path | None, calls: int, flags: list[str]) -> None:
    name = probe.db
    with tempfile.TemporaryDirectory(prefix="effectd-cost-", dir="/tmp") as tmp:
        proc = _daemon(f"{tmp}/d", "--store", _url(name), *flags)
        target = f"unix:{tmp}/d/effectd.sock"
        try:
            asyncio.run(_phase(target, "warm", 20, dup=False))
            print(f"effectd on PostgreSQL, 1 daemon, 1 caller, {calls} calls a phase")
            print(
                f"{'phase':<7}{'commits':>9}{'read txns':>11}{'statements':>12}"
                f"{'WAL bytes':>11}{'daemon ms':>11}{'PG ms':>8}"
            )
            for phase, dup in (("first", False), ("dup", True)):
                pids = set(probe.backends())
                before = probe.mark()
                offset = log.stat().st_size if log is not None else 0
                cpu_d = _cpu_ms(proc.pid)
                cpu_pg = {p: _cpu_ms(p) for p in pids}
                asyncio.run(_phase(target, "bench", calls, dup=dup))
                after = probe.mark()
                pids |= set(probe.backends())
                daemon_ms = (_cpu_ms(proc.pid) - cpu_d) / calls
                pg_ms = sum(_cpu_ms(p) - cpu_pg.get(p, 0.0) for p in pids) / calls
                wal, writes = probe.wal(before["lsn"], after["lsn"])
                transactions = int(str(after["commit"])) - int(str(before["commit"]))
                transactions += int(str(after["rollback"])) - int(
                    str(before["rollback"])
                )
                # The probe's own two reads of pg_stat_database are not counted.
                statements = _count_statements(log, offset, name)
                shown = "n/a" if statements is None else f"{statements / calls:.2f}"
                print(
                    f"{phase:<7}{writes / calls:>9.2f}"
                    f"{(transactions - writes) / calls:>11.2f}"
                    f"{shown:>12}"
                    f"{wal / calls:>11.0f}{daemon_ms:>11.2f}{pg_ms:>8.2f}"
                )
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
