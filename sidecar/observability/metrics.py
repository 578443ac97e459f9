"""Prometheus metrics of one daemon, on a registry of its own.

Several daemons run in one test process, so nothing here touches
prometheus_client's global registry. Label values are bounded by
construction: a method is one of the served ones (anything else is
`other`), a code is a `grpc.StatusCode`, a reason one of the `ErrorReason`
names, a state one of the ledger's states, a route one of the configured
routes. Values that change inside the daemon (RPCs, commits, refusals) are
counted where they happen; values that already live elsewhere (records by
state, the provider proxy's counters and retry budget) are read at scrape
time by the collectors of `sidecar.observability.collectors`, so the hot
paths do not pay for them; so are the process's own (CPU, memory, open
files: prometheus_client's ProcessCollector and `observability.process`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

import grpc
from effectd.v1 import (
    admin_pb2,
    checkpoints_pb2,
    errors_pb2,
    ledger_pb2,
    provider_pb2,
    recovery_pb2,
    retry_pb2,
)
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

from sidecar.ledger.quota import DiskSpace
from sidecar.observability.collectors import (
    DiskCollector,
    LedgerCollector,
    ProviderCollector,
    ProviderSource,
)
from sidecar.observability.process import ResidentMemoryCollector
from sidecar.storage.api import Store

# The label of every method the daemon does not serve (probes, typos, scans):
# one value, whatever a client sends.
OTHER = "other"

_FILES = (
    ledger_pb2,
    checkpoints_pb2,
    recovery_pb2,
    retry_pb2,
    admin_pb2,
    provider_pb2,
)
_EXTRA_METHODS = (
    "grpc.health.v1.Health/Check",
    "grpc.health.v1.Health/Watch",
    "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
)


def served_methods() -> frozenset[str]:
    """`package.Service/Method` of every RPC the daemon serves."""
    names = {
        f"{service.full_name}/{method.name}"
        for module in _FILES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    return frozenset(names | set(_EXTRA_METHODS))


_REASONS = frozenset(errors_pb2.ErrorReason.keys())

# Latency of a unary RPC: a group commit with fsync is about a millisecond;
# provider calls and watches take seconds.
RPC_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# Powers of two up to LmdbOptions.max_batch (256).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
COMMIT_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


# Methods not served fall into `other`: their names, which a client picks,
# must not grow the table of children without bound.
_MAX_CHILDREN = 1024


class Metrics:
    """The metrics of one daemon; `registry` is what `/metrics` serves.

    Every method is thread-safe: `commit_observed` runs on the LMDB writer
    thread, the others on the event loop, collectors on the HTTP thread.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # The process: prometheus_client's standard process_* metrics (CPU,
        # resident and virtual memory, open files, start time), and the
        # resident memory split into anon and mapped-file pages, since the
        # LMDB map makes the total look like a leak (observability.process).
        ProcessCollector(registry=self.registry)
        self.registry.register(ResidentMemoryCollector())
        self._methods = served_methods()
        self._requests = Counter(
            "effectd_rpc_requests",
            "RPCs finished, by method and gRPC status code.",
            ("method", "code"),
            registry=self.registry,
        )
        self._duration = Histogram(
            "effectd_rpc_duration_seconds",
            "Seconds from the first byte of an RPC to its status, by method.",
            ("method",),
            buckets=RPC_BUCKETS,
            registry=self.registry,
        )
        self._batch = Histogram(
            "effectd_store_commit_batch_size",
            "Write requests committed together in one LMDB transaction.",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self._commit = Histogram(
            "effectd_store_commit_seconds",
            "Seconds one group commit took, its fsync included.",
            buckets=COMMIT_BUCKETS,
            registry=self.registry,
        )
        # The children of _requests and _duration, by full method and code.
        self._children: dict[tuple[str, grpc.StatusCode], tuple[Any, Any]] = {}
        self._refusals = Counter(
            "effectd_refusals",
            "Refusals answered, by ErrorReason.",
            ("reason",),
            registry=self.registry,
        )

    def method_label(self, method: str) -> str:
        """`/pkg.Service/Method` as `pkg.Service/Method`, or `other`."""
        name = method.removeprefix("/")
        return name if name in self._methods else OTHER

    def rpc_finished(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Counts one finished RPC; `method` is the full gRPC method name."""
        children = self._children.get((method, code))
        if children is None:
            # Looked up once per method and code (a few dozen at most: the
            # methods served, `other`, the codes): `labels` builds its key
            # and takes a lock on every call, as much as the count itself.
            label = self.method_label(method)
            children = (
                self._requests.labels(label, code.name),
                self._duration.labels(label),
            )
            if len(self._children) < _MAX_CHILDREN:
                self._children[(method, code)] = children
        requests, duration = children
        requests.inc()
        duration.observe(max(0.0, seconds))

    def refused(self, reason: str) -> None:
        """Counts one refusal by its `ErrorReason` name (others: `other`)."""
        self._refusals.labels(reason if reason in _REASONS else OTHER).inc()

    def commit_observed(self, batch_size: int, seconds: float) -> None:
        """One durable group commit of `batch_size` requests."""
        self._batch.observe(batch_size)
        self._commit.observe(max(0.0, seconds))

    def watch_store(self, store: Store) -> Callable[[], None]:
        """Exports `effectd_ledger_calls{state}`, read at each scrape; returns
        the function that stops it. Call that before the store closes: it
        waits for a scrape reading the store, and no later one reads it."""
        collector = LedgerCollector(store)
        unwatch = self._watch(collector)

        def stop() -> None:
            unwatch()
            collector.stop()

        return stop

    def watch_disk(self, read: Callable[[], DiskSpace]) -> Callable[[], None]:
        """Exports the data directory's free and total bytes, `read` at each
        scrape."""
        return self._watch(DiskCollector(read))

    def watch_provider(self, provider: ProviderSource) -> Callable[[], None]:
        """Exports the provider proxy's counters and retry budget credit."""
        return self._watch(ProviderCollector(provider))

    def _watch(self, collector: Collector) -> Callable[[], None]:
        self.registry.register(collector)

        def unwatch() -> None:
            # A second call finds it gone; stop() may run more than once.
            with contextlib.suppress(KeyError):
                self.registry.unregister(collector)

        return unwatch


class _Handler(MetricsHandler):
    # A scrape that stalls cannot hold `close` up for longer than this.
    timeout = 5.0

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the daemon's own log lines are the only ones on stderr."""


class _Server(ThreadingHTTPServer):
    # A scrape stalled by its client must not hold the daemon's stop up;
    # the collectors, stopped first, keep such a thread away from the store.
    daemon_threads = True
    block_on_close = False


class MetricsServer:
    """`/metrics` over HTTP from a thread of its own; `close` stops it."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        server_class = type("_Server", (_Server,), {"address_family": _family(bare)})
        handler = type("_Bound", (_Handler,), {"registry": metrics.registry})
        self._httpd: ThreadingHTTPServer = server_class((bare, port), handler)
        self.host = bare
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="effectd-metrics",
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    @property
    def address(self) -> str:
        """HOST:PORT as bound (port 0 resolved), IPv6 hosts in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def close(self) -> None:
        """Stops accepting and releases the port; blocks for at most one
        poll interval (50 ms); safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def serve_metrics(metrics: Metrics, host: str, port: int) -> MetricsServer:
    """Serves `metrics` at http://HOST:PORT/metrics; port 0 picks a free one.

    The caller checks that `host` is loopback (`ServeConfig.validate`): the
    endpoint has no authentication, like every Prometheus target.
    """
    return MetricsServer(metrics, host, port)


__all__ = [
    "BATCH_BUCKETS",
    "COMMIT_BUCKETS",
    "OTHER",
    "RPC_BUCKETS",
    "Metrics",
    "MetricsServer",
    "serve_metrics",
    "served_methods",
]
