"""Metrics: bounded labels, thread-safe commit observation, ledger counts
read at scrape time, and /metrics served by a real daemon."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from effectd_client import Client, Effect
from effectd_client import EffectdError as ClientError
from sidecar.config import ServeConfig
from sidecar.ledger.model import State
from sidecar.observability.collectors import count_states
from sidecar.observability.metrics import (
    OTHER,
    Metrics,
    serve_metrics,
    served_methods,
)
from sidecar.observability.process import ResidentMemoryCollector, resident_memory
from sidecar.storage.api import ReadView, Table, WriteView
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore
from sidecar.storage.records import state_prefix
from sidecar.testing import running_daemon
from tests.observability.support import scrape

T = TypeVar("T")


def _served(metrics: Metrics) -> str:
    server = serve_metrics(metrics, "127.0.0.1", 0)
    try:
        return scrape(server.address).text
    finally:
        server.close()


def test_method_labels_are_bounded() -> None:
    """A served method is labelled by its name; anything a client makes up
    shares one `other` label, so clients cannot grow the series."""
    metrics = Metrics()
    metrics.rpc_finished("/effectd.v1.ToolLedger/PrepareTool", grpc.StatusCode.OK, 0.01)
    for i in range(50):
        metrics.rpc_finished(f"/x.Y/Z{i}", grpc.StatusCode.UNIMPLEMENTED, 0.0)
    metrics.refused("INPUT_MISMATCH")
    metrics.refused("NOT-A-REASON\n")
    server = serve_metrics(metrics, "127.0.0.1", 0)
    try:
        got = scrape(server.address)
    finally:
        server.close()
    ok = {"method": "effectd.v1.ToolLedger/PrepareTool", "code": "OK"}
    assert got.value("effectd_rpc_requests_total", **ok) == 1
    assert (
        got.value("effectd_rpc_requests_total", method=OTHER, code="UNIMPLEMENTED")
        == 50
    )
    assert got.value("effectd_refusals_total", reason="INPUT_MISMATCH") == 1
    assert got.value("effectd_refusals_total", reason=OTHER) == 1
    methods = {v for (_, labels) in got.samples for k, v in labels if k == "method"}
    assert methods == {"effectd.v1.ToolLedger/PrepareTool", OTHER}


def test_every_service_method_has_a_label() -> None:
    """The label set covers the six effectd services, health and reflection."""
    methods = served_methods()
    for service in (
        "ToolLedger",
        "Checkpoints",
        "Recovery",
        "RetryPolicy",
        "Admin",
        "Provider",
    ):
        assert any(m.startswith(f"effectd.v1.{service}/") for m in methods)
    assert "grpc.health.v1.Health/Check" in methods


def test_commits_observed_from_many_threads_are_all_counted() -> None:
    """commit_observed is called from the writer thread while scrapes read:
    no observation is lost."""
    metrics = Metrics()

    def work() -> None:
        for _ in range(500):
            metrics.commit_observed(3, 0.001)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    text = _served(metrics)
    assert "effectd_store_commit_batch_size_count 4000.0" in text
    assert "effectd_store_commit_batch_size_sum 12000.0" in text
    assert "effectd_store_commit_seconds_count 4000.0" in text


class _ScanOnly:
    """A store without an entry count: every state is scanned."""

    def __init__(self, store: LmdbStore) -> None:
        self._store = store

    def read(self, fn: Callable[[ReadView], T]) -> T:
        return self._store.read(fn)


def test_state_counts_by_index_entry_count_equal_a_full_scan(
    short_tmp: Path,
) -> None:
    """COMMITTED derived from the index's entry count equals counting every
    entry; the open states are scanned in both."""
    store = LmdbStore(short_tmp / "db", LmdbOptions(sync=False))
    try:
        written = {State.COMMITTED: 300, State.UNKNOWN: 7, State.STARTED: 2}

        def fill(view: WriteView) -> None:
            for state, n in written.items():
                for i in range(n):
                    key = state_prefix(state, "ns") + f"r\x00c{i}".encode()
                    view.put(Table.CALL_STATES, key, b"")

        store.submit(fill).result()
        expected = {s: written.get(s, 0) for s in State}
        assert count_states(store) == expected
        assert count_states(_ScanOnly(store)) == expected  # type: ignore[arg-type]
    finally:
        store.close()


def test_metrics_server_stops_and_frees_its_port() -> None:
    """close() stops serving and releases the port; a second close is a no-op."""
    server = serve_metrics(Metrics(), "127.0.0.1", 0)
    port = server.port
    assert server.address == f"127.0.0.1:{port}"
    server.close()
    server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_metrics_server_on_ipv6_loopback() -> None:
    """[::1]:0 binds the IPv6 loopback."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server = serve_metrics(Metrics(), "[::1]", 0)
    except OSError:
        pytest.skip("::1 is not configured here")
    try:
        assert server.address == f"[::1]:{server.port}"
        assert "effectd_rpc_requests" in scrape(server.address).text
    finally:
        server.close()


def test_a_daemon_serves_its_metrics(short_tmp: Path) -> None:
    """After prepares and commits through the real client, the daemon's
    /metrics shows the RPCs by method and code, the group commits, the
    refusals by reason, and the ledger's records by state as written."""
    config = ServeConfig(data_dir=short_tmp / "data", metrics_listen="127.0.0.1:0")
    with running_daemon(config) as running, Client(running.target) as client:
        for call in ("c1", "c2"):
            first = client.prepare_tool("r", call, "t", {"n": 1}, start=True)
            client.commit_tool("r", call, first.call.attempt, {"ok": True})
        client.prepare_tool("r", "c3", "t", {}, effect=Effect.READ, start=True)
        client.prepare_tool("r", "c4", "t", {})
        with pytest.raises(ClientError):
            client.prepare_tool("r", "c4", "t", {"other": "input"})
        listed = {c.state.name for c in client.list_tool_calls(run_id="r")}
        address = running.daemon.metrics_address
        assert address is not None
        got = scrape(address)
    # Five prepares (one refused) and two commits.
    for method, ok, total in (("PrepareTool", 4, 5), ("CommitTool", 2, 2)):
        name = f"effectd.v1.ToolLedger/{method}"
        assert got.value("effectd_rpc_requests_total", method=name, code="OK") == ok
        assert got.value("effectd_rpc_duration_seconds_count", method=name) == total
    assert (
        got.value(
            "effectd_rpc_requests_total",
            method="effectd.v1.ToolLedger/PrepareTool",
            code="FAILED_PRECONDITION",
        )
        == 1
    )
    assert got.value("effectd_refusals_total", reason="INPUT_MISMATCH") == 1
    assert (got.value("effectd_store_commit_batch_size_count") or 0) > 0
    assert (got.value("effectd_store_commit_seconds_count") or 0) > 0
    calls = {
        state.name: got.value("effectd_ledger_calls", state=state.name)
        for state in State
    }
    assert calls == {
        "PREPARED": 1,
        "AWAITING_APPROVAL": 0,
        "STARTED": 1,
        "UNKNOWN": 0,
        "COMMITTED": 2,
    }
    assert listed == {"PREPARED", "STARTED", "COMMITTED"}


def test_a_stopped_daemon_serves_no_metrics(short_tmp: Path) -> None:
    """The metrics port closes with the daemon; without metrics_listen there
    is none."""
    config = ServeConfig(data_dir=short_tmp / "data", metrics_listen="127.0.0.1:0")
    with running_daemon(config) as running:
        address = running.daemon.metrics_address
    assert address is not None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{address}/metrics", timeout=2)
    with running_daemon(ServeConfig(data_dir=short_tmp / "d2")) as running:
        assert running.daemon.metrics_address is None


def _put(key: bytes, value: bytes) -> Callable[[WriteView], None]:
    def write(view: WriteView) -> None:
        view.put(Table.META, key, value)

    return write


def test_the_writer_reports_every_commit(short_tmp: Path) -> None:
    """on_commit sees each durable commit once, with its batch size: the
    sizes add up to the writes submitted, however they were grouped."""
    seen: list[tuple[int, float]] = []
    options = LmdbOptions(sync=False, on_commit=lambda n, s: seen.append((n, s)))
    store = LmdbStore(short_tmp / "db", options)
    try:
        before = sum(n for n, _ in seen)  # the store's own opening writes
        futures = [store.submit(_put(f"k{i}".encode(), b"v")) for i in range(200)]
        for f in futures:
            f.result(timeout=30)
    finally:
        store.close()
    assert sum(n for n, _ in seen) - before == 200
    assert all(n >= 1 and s >= 0 for n, s in seen)


def test_a_failing_commit_observer_does_not_stop_the_writer(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An observer that raises is logged; the writes are answered and the
    writer goes on."""

    def broken(batch: int, seconds: float) -> None:
        raise RuntimeError("observer bug")

    store = LmdbStore(short_tmp / "db", LmdbOptions(sync=False, on_commit=broken))
    try:
        for i in range(3):
            store.submit(_put(b"k", b"%d" % i)).result(10)
        assert store.read(lambda v: v.get(Table.META, b"k")) == b"2"
    finally:
        store.close()
    assert "the commit observer failed" in caplog.text


def test_a_stopped_store_watch_reads_nothing(short_tmp: Path) -> None:
    """Once its stop function ran, a scrape reads no more of the store (it
    may be closed): the gauge has no samples and the scrape still answers."""
    metrics = Metrics()
    store = LmdbStore(short_tmp / "db", LmdbOptions(sync=False))
    stop = metrics.watch_store(store)
    assert "effectd_ledger_calls{" in _served(metrics)
    stop()
    stop()
    store.close()
    text = _served(metrics)
    assert "effectd_ledger_calls{" not in text
    assert "effectd_rpc_requests" in text


def test_a_daemon_serves_its_process_metrics(short_tmp: Path) -> None:
    """/metrics has the process's standard metrics and its resident memory
    split into anon and file (mapped) pages, so the LMDB map need not look
    like a leak; the parts are read from the kernel (issue 10 item 32:
    fails before the fix: there were no process metrics)."""
    config = ServeConfig(data_dir=short_tmp / "data", metrics_listen="127.0.0.1:0")
    with running_daemon(config) as running, Client(running.target) as client:
        client.prepare_tool("r", "c1", "t", {"n": 1})
        address = running.daemon.metrics_address
        assert address is not None
        got = scrape(address)
    for name in (
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert (got.value(name) or 0) > 0, name
    anon = got.value("effectd_process_resident_memory_bytes", kind="anon") or 0
    mapped = got.value("effectd_process_resident_memory_bytes", kind="file") or 0
    assert anon > 0
    assert mapped > 0
    assert anon + mapped <= 2 * (got.value("process_resident_memory_bytes") or 0)


STATUS = """Name:\tpython
VmRSS:\t  120000 kB
RssAnon:\t   80000 kB
RssFile:\t   39000 kB
RssShmem:\t    1000 kB
Threads:\t12
"""


def test_resident_memory_is_read_from_proc_status(short_tmp: Path) -> None:
    """The split is RssAnon, RssFile and RssShmem in bytes; a status file
    without them, or none at all (not Linux), exports nothing."""
    assert resident_memory(STATUS) == {
        "anon": 80000 * 1024,
        "file": 39000 * 1024,
        "shmem": 1000 * 1024,
    }
    status = short_tmp / "status"
    status.write_text(STATUS)
    families = list(ResidentMemoryCollector(status).collect())
    assert [(s.labels["kind"], s.value) for s in families[0].samples] == [
        ("anon", 80000 * 1024),
        ("file", 39000 * 1024),
        ("shmem", 1000 * 1024),
    ]
    status.write_text("Name:\tpython\n")
    assert list(ResidentMemoryCollector(status).collect()) == []
    assert list(ResidentMemoryCollector(short_tmp / "absent").collect()) == []
