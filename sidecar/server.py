"""Wiring and lifecycle of the daemon.

Start: lock the socket, open the store (which locks the data directory),
settle calls left STARTED by an earlier incarnation, bind, then report
SERVING. Stop: health NOT_SERVING, stop accepting, let in-flight calls finish
within the grace period, then close the store and remove the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import httpx
from effectd.v1 import (
    admin_pb2,
    checkpoints_pb2,
    ledger_pb2,
    provider_pb2,
    recovery_pb2,
    retry_pb2,
)
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.auth import tokens
from sidecar.auth.access import Credentials
from sidecar.clock import Clock, SystemClock
from sidecar.config import ConfigError, ServeConfig, split_host_port
from sidecar.directories import refuse_unsafe_directory
from sidecar.errors import ShuttingDown
from sidecar.ledger.policy import FixedPolicy, PolicySource
from sidecar.ledger.quota import RateLimiter
from sidecar.ledger.restore import Marker
from sidecar.locking import ExclusiveLock
from sidecar.observability import logs
from sidecar.observability.metrics import Metrics, MetricsServer, serve_metrics
from sidecar.observability.provider import ProviderMonitor
from sidecar.policy_file import PolicyFile
from sidecar.provider.budget import RetryBudget
from sidecar.provider.client import ProviderClient, Sleep
from sidecar.provider.routes import Route, load_providers
from sidecar.rpc import tls
from sidecar.rpc.admin import Admin
from sidecar.rpc.checkpoints import Checkpoints
from sidecar.rpc.concurrency import Slots
from sidecar.rpc.gate import Gate
from sidecar.rpc.handlers import generic_handler
from sidecar.rpc.ledger import ToolLedger
from sidecar.rpc.provider import Provider
from sidecar.rpc.recovery import Recovery
from sidecar.rpc.retry import RetryPolicy
from sidecar.services.checkpoints import CheckpointService
from sidecar.services.ledger import LedgerService
from sidecar.services.operator import OperatorService
from sidecar.services.policy import PolicyService, Reload
from sidecar.services.recovery import RecoveryService
from sidecar.services.retention import PassResult, RetentionService
from sidecar.services.retry import RetryService
from sidecar.services.settlement import SettlementService, SettlePass
from sidecar.storage import restore
from sidecar.storage.api import ReportsFill, Store
from sidecar.storage.lmdb_store import LmdbOptions, LmdbStore
from sidecar.storage.scans import Scans

if TYPE_CHECKING:
    from sidecar.observability.otel import Tracing

log = logging.getLogger(__name__)

SERVICES = (
    ledger_pb2.DESCRIPTOR.services_by_name["ToolLedger"],
    checkpoints_pb2.DESCRIPTOR.services_by_name["Checkpoints"],
    recovery_pb2.DESCRIPTOR.services_by_name["Recovery"],
    retry_pb2.DESCRIPTOR.services_by_name["RetryPolicy"],
    admin_pb2.DESCRIPTOR.services_by_name["Admin"],
    provider_pb2.DESCRIPTOR.services_by_name["Provider"],
)


def server_options(cfg: ServeConfig) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments (reliability-anchors §7)."""
    limits = cfg.server_limits

    def ms(seconds: float) -> int:
        return max(1, int(seconds * 1000))

    return [
        # A second daemon must fail to bind, not share the port.
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_metadata_size", 16 << 10),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.server_handshake_timeout_ms", ms(limits.handshake_timeout_seconds)),
        ("grpc.max_connection_idle_ms", ms(limits.max_connection_idle_seconds)),
        # Keepalive enforcement: pings more frequent than this (with or
        # without calls in flight) earn strikes, then GOAWAY.
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            ms(limits.min_ping_interval_seconds),
        ),
        (
            "grpc.http2.min_recv_ping_interval_without_data_ms",
            ms(limits.min_ping_interval_seconds),
        ),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 1),
        # The server pings idle connections to find peers that died without
        # closing (a crashed agent, a dropped network).
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
    ]


def load_credentials(cfg: ServeConfig) -> Credentials | None:
    if cfg.tokens_file is not None and cfg.tokens_text is not None:
        raise ConfigError("tokens-file and EFFECTD_TOKENS: set one, not both")
    if cfg.tokens_file is not None:
        return tokens.load_file(cfg.tokens_file)
    if cfg.tokens_text is not None:
        return tokens.parse(cfg.tokens_text)
    return None


def load_tracing(cfg: ServeConfig) -> Tracing | None:
    """OpenTelemetry spans with `otel` on; imported only then, so a daemon
    without it loads none of the SDK."""
    if not cfg.otel:
        return None
    try:
        from sidecar.observability import otel  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("opentelemetry"):
            raise
        raise ConfigError(
            "otel: needs the otel extra (pip install effectd[otel])"
        ) from None
    return otel.from_environment()


def _restore_marker(store: Store) -> Marker | None:
    """How the store was restored, said in the log at every start."""
    restored = store.read(restore.load_marker)
    if restored is not None:
        log.warning(
            "this store was restored from the backup %s by %s (restore %d, "
            "audit entry %d): calls recorded after that backup are unknown to it",
            restored.backup,
            restored.actor,
            restored.count,
            restored.audit_sequence,
        )
    return restored


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a started daemon listens: gRPC targets for clients."""

    unix: str
    tcp: str | None


class Daemon:
    def __init__(self, config: ServeConfig, clock: Clock | None = None) -> None:
        config.validate()
        self.config = config
        self._clock = clock or SystemClock()
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.health_address: str | None = None
        self.credentials: Credentials | None = load_credentials(config)
        self.metrics = Metrics()
        self.metrics_server: MetricsServer | None = None
        # HOST:PORT of /metrics once started (port 0 resolved), or None.
        self.metrics_address: str | None = None
        self._unwatch: list[Callable[[], None]] = []
        if self.credentials is not None:
            logs.add_secret_digests(self.credentials.digests())
        self._health: health_aio.HealthServicer | None = None
        self._store: Store | None = None
        # The long reads of the store, on worker threads; shared by the services.
        self._scans: Scans | None = None
        self._socket_lock: ExclusiveLock | None = None
        self.endpoints: Endpoints | None = None
        self._retention: RetentionService | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self._settlement: SettlementService | None = None
        self._settlement_task: asyncio.Task[None] | None = None
        self._policies: PolicyService | None = None
        # The jitter source of retry backoffs (spreading, not secrecy); a seam
        # for deterministic tests.
        self.retry_random: Callable[[], float] = random.Random().random  # noqa: S311
        self.policy: PolicySource = (
            FixedPolicy()
            if config.policy_file is None
            else PolicyFile(config.policy_file)
        )
        providers = config.providers_file
        self.routes: dict[str, Route] = (
            {} if providers is None else load_providers(providers)
        )
        logs.add_secrets(r.credential for r in self.routes.values() if r.credential)
        # Seams of the provider proxy: the HTTP transport (None: httpx's own
        # pooled one) and the sleep between retries.
        self.provider_transport: httpx.AsyncBaseTransport | None = None
        self.provider_sleep: Sleep = asyncio.sleep
        self._http: httpx.AsyncClient | None = None
        self.provider: ProviderClient | None = None
        # Last: its exporters may start threads. A seam: tests put a provider
        # with an in-memory exporter here.
        self.tracing: Tracing | None = load_tracing(config)

    def open_store(self) -> Store:
        refuse_unsafe_directory(self.config.data_dir, "data-dir", sticky_ok=False)
        try:
            restore.refuse_unfinished(self.config.data_dir)
        except restore.UnfinishedRestore as exc:
            raise ConfigError(f"data-dir: {exc}") from None
        if not self.config.sync:
            log.warning(
                "sync is off (--no-sync): an answer can leave before its write "
                "is on disk, so after a power loss a call answered STARTED can "
                "be answered EXECUTE again and its side effect run twice"
            )
        options = LmdbOptions(
            map_size=self.config.map_size,
            sync=self.config.sync,
            on_commit=self.metrics.commit_observed,
        )
        return LmdbStore(self.config.data_dir, options)

    def _scans_of(self, store: Store) -> Scans:
        """The long reads of `store`, one bound for every service."""
        if self._scans is None:
            self._scans = Scans(store)
        return self._scans

    def make_ledger(self, store: Store) -> LedgerService:
        return LedgerService(
            store,
            self._clock,
            self.config.limits,
            self.policy,
            quotas=self.config.quotas,
            scans=self._scans_of(store),
        )

    def make_operator(self, store: Store) -> OperatorService:
        return OperatorService(
            store,
            self._clock,
            self.config.limits,
            policy=self.policy,
            scans=self._scans_of(store),
        )

    async def start(self) -> Endpoints:
        cfg = self.config
        sock = cfg.socket_path
        refuse_unsafe_directory(cfg.data_dir, "data-dir", sticky_ok=False)
        sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The socket itself is 0600, but whoever may write its directory could
        # rename it and put a socket of their own in its place.
        refuse_unsafe_directory(sock.parent, "socket", sticky_ok=True)
        self._socket_lock = ExclusiveLock(
            sock.with_name(sock.name + ".lock"), f"socket {sock}"
        )
        try:
            return await self._start()
        except BaseException:
            await self.stop(grace=0)
            raise

    async def _start(self) -> Endpoints:
        cfg = self.config
        store = self._store = self.open_store()
        self._unwatch.append(self.metrics.watch_store(store))
        restored = _restore_marker(store)
        ledger = self.make_ledger(store)
        settled = await ledger.settle_earlier_incarnations()
        if settled:
            log.warning("%d calls started before the restart are now UNKNOWN", settled)
        self._retention = RetentionService(
            store, self._clock, self.policy, scans=self._scans_of(store)
        )
        # DESIGN §4: a compaction pass at start, then one per interval.
        await self.compact_expired()
        self._policies = PolicyService(store, self._clock, self.policy)

        limits = cfg.server_limits
        slots = Slots(limits.max_concurrent_rpcs, limits.max_concurrent_rpcs_per_caller)
        server = self._server = grpc.aio.server(
            interceptors=[self._gate(slots)],
            options=server_options(cfg),
            maximum_concurrent_rpcs=slots.backstop,
        )
        operator = self.make_operator(store)
        server.add_generic_rpc_handlers(
            (
                generic_handler(SERVICES[0], ToolLedger(ledger, operator)),
                generic_handler(
                    admin_pb2.DESCRIPTOR.services_by_name["Admin"],
                    Admin(
                        operator,
                        self._policies,
                        backup=store.backup,
                        quotas=cfg.quotas,
                        incarnation=store.incarnation,
                        fill=store.fill if isinstance(store, ReportsFill) else None,
                        restored=restored,
                    ),
                ),
                generic_handler(
                    SERVICES[1],
                    Checkpoints(
                        CheckpointService(
                            store,
                            self._clock,
                            quotas=cfg.quotas,
                            scans=self._scans_of(store),
                        ),
                        cfg.limits,
                    ),
                ),
                generic_handler(
                    recovery_pb2.DESCRIPTOR.services_by_name["Recovery"],
                    Recovery(
                        RecoveryService(store, self._clock, cfg.limits, self.policy)
                    ),
                ),
                generic_handler(
                    retry_pb2.DESCRIPTOR.services_by_name["RetryPolicy"],
                    RetryPolicy(
                        RetryService(
                            store, self._clock, self.policy, random=self.retry_random
                        ),
                        cfg.limits,
                    ),
                ),
            )
        )
        # One pooled client per daemon; redirects are never followed (a 3xx
        # is an answer) and the environment's proxies and .netrc are ignored.
        # HTTP/2 is used where a TLS upstream offers it (ALPN).
        self._http = httpx.AsyncClient(
            http2=True,
            transport=self.provider_transport,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        budget = RetryBudget(self._clock)
        monitor = ProviderMonitor(self.routes, budget)
        self.provider = ProviderClient(
            self.routes,
            self._http,
            self._clock,
            budget=budget,
            rng=self.retry_random,
            sleep=self.provider_sleep,
            observer=monitor,
            limits=cfg.limits,
        )
        self._unwatch.append(self.metrics.watch_provider(monitor))
        server.add_generic_rpc_handlers(
            (
                generic_handler(
                    provider_pb2.DESCRIPTOR.services_by_name["Provider"],
                    Provider(self.provider),
                ),
            )
        )
        self._health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [s.full_name for s in SERVICES]
        if cfg.reflection:
            reflection.enable_server_reflection(
                [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
            )

        sock = cfg.socket_path
        # We hold the socket lock: a file still there is left from a crash.
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        server.add_insecure_port(f"unix:{sock}")
        tcp = None
        if cfg.listen is not None:
            host, _ = split_host_port("listen", cfg.listen)
            if cfg.tls:
                port = server.add_secure_port(
                    cfg.listen, tls.server_credentials(cfg, self._clock)
                )
            else:
                port = server.add_insecure_port(cfg.listen)
            tcp = f"{host}:{port}"
        await server.start()
        os.chmod(sock, 0o600)
        self.health_address = await self._start_health_port()
        if cfg.metrics_listen is not None:
            host, port = split_host_port("metrics-listen", cfg.metrics_listen)
            self.metrics_server = serve_metrics(self.metrics, host, port)
            self.metrics_address = self.metrics_server.address
        for name in ("", *names):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.endpoints = Endpoints(f"unix:{sock}", tcp)
        log.info(
            "effectd serving on %s%s (incarnation %d)",
            self.endpoints.unix,
            f" and {tcp}" if tcp else "",
            store.incarnation,
        )
        self._start_periodic_passes()
        return self.endpoints

    def _start_periodic_passes(self) -> None:
        if self._store is not None:
            self._settlement = SettlementService(self._store, self._clock)
        self._retention_task = asyncio.create_task(
            self._retention_loop(), name="effectd-retention"
        )
        self._settlement_task = asyncio.create_task(
            self._settlement_loop(), name="effectd-settlement"
        )

    def _gate(self, slots: Slots) -> Gate:
        cfg = self.config
        quotas = cfg.quotas
        admission = (
            RateLimiter(quotas.requests_per_second, quotas.burst, time.monotonic)
            if quotas.requests_per_second > 0
            else None
        )
        if self.credentials is None:
            log.warning(
                "authentication is off (no tokens-file, no EFFECTD_TOKENS): "
                "serving only the Unix socket%s",
                f" and loopback {cfg.listen}" if cfg.listen else "",
            )
        else:
            log.info("authentication is on: %d tokens", len(self.credentials))
        return Gate(
            self.credentials,
            admission=admission,
            observer=self.metrics,
            tracer=self.tracing,
            default_deadline=cfg.server_limits.default_deadline_seconds,
            slots=slots,
        )

    async def _start_health_port(self) -> str | None:
        """A plaintext port serving only grpc.health.v1, for probes that can
        bring neither credentials nor a Unix socket (Kubernetes)."""
        if self.config.health_listen is None or self._health is None:
            return None
        server = self._health_server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0)]
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        host, _ = split_host_port("health-listen", self.config.health_listen)
        port = server.add_insecure_port(self.config.health_listen)
        await server.start()
        return f"{host}:{port}"

    async def compact_expired(self) -> PassResult | None:
        """One compaction pass of the retention window (DESIGN §4); a failure
        is logged and leaves every record in place."""
        if self._retention is None:
            return None
        try:
            done = await self._retention.compact()
        except Exception:
            log.exception("the compaction pass failed; no record was compacted")
            return None
        if done.compacted:
            log.info(
                "retention: %d of %d committed calls compacted to tombstones",
                done.compacted,
                done.examined,
            )
        if done.expired:
            log.info(
                "retention: %d tombstones deleted after their lifetime", done.expired
            )
        return done

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_interval_seconds)
            await self.compact_expired()

    async def settle_expired(self) -> SettlePass | None:
        """One settlement pass: STARTED calls whose lease ran out become
        UNKNOWN; a failure is logged, and the next pass tries again."""
        if self._settlement is None:
            return None
        try:
            done = await self._settlement.settle()
        except Exception:
            log.exception("the settlement pass failed; no call was settled")
            return None
        if done.settled:
            log.warning(
                "%d STARTED calls whose lease ran out are now UNKNOWN", done.settled
            )
        return done

    async def _settlement_loop(self) -> None:
        # On the injected clock, as the leases are.
        while True:
            await self._clock.sleep(self.config.settle_interval_seconds)
            await self.settle_expired()

    async def reload_policy(self, actor: str, reason: str = "") -> Reload:
        """Reloads the policy file with its audit entry (ADR-010 R2); see
        `PolicyService.reload` for the refusals."""
        if self._policies is None:
            raise ShuttingDown("the daemon is not serving")
        return await self._policies.reload(actor=actor, reason=reason)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop; safe to call more than once."""
        grace = self.config.grace_seconds if grace is None else grace
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
            self._retention_task = None
        if self._settlement_task is not None:
            self._settlement_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._settlement_task
            self._settlement_task = None
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.config.socket_path.unlink()
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.close)
            self.metrics_server = None
        if self.tracing is not None:
            # Exports the spans still queued (bounded by the SDK's timeout).
            await asyncio.to_thread(self.tracing.close)
        # Waits for a scrape reading the store; no later one reads it.
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch.clear()
        if self._scans is not None:
            # No scan's thread may read the store as it closes.
            await self._scans.close()
            self._scans = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._socket_lock is not None:
            self._socket_lock.release()
            self._socket_lock = None
