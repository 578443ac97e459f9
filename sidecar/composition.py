"""The composition root: the daemon's services wired from its configuration
and its seams.

`open_store` opens the store a daemon serves; `compose` reads the files the
configuration names (tokens, policy, provider routes), builds every service
over that store with the injected clock, random source, HTTP transport and
tracer, and returns them as `Services`; `handlers` turns those into the gRPC
servicers. Nothing here listens, starts a task or registers a signal: that is
the lifecycle of `sidecar.server.Daemon`, which calls these at start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

from sidecar.auth import tokens
from sidecar.auth.access import Credentials
from sidecar.clock import monotonic_seconds
from sidecar.config import ConfigError, ServeConfig, masked_url, url_password
from sidecar.directories import data_disk, refuse_unsafe_directory
from sidecar.failpoints import Failpoints
from sidecar.ledger.policy import FixedPolicy, PolicySource
from sidecar.ledger.quota import RateLimiter
from sidecar.ledger.restore import Marker
from sidecar.observability import logs
from sidecar.observability.metrics import Metrics
from sidecar.observability.provider import ProviderMonitor
from sidecar.policy_file import PolicyFile
from sidecar.provider.budget import RetryBudget
from sidecar.provider.client import ProviderClient
from sidecar.provider.routes import load_providers
from sidecar.rpc.admin import Admin
from sidecar.rpc.checkpoints import Checkpoints
from sidecar.rpc.concurrency import Slots
from sidecar.rpc.gate import Gate
from sidecar.rpc.handlers import generic_handler
from sidecar.rpc.ledger import ToolLedger
from sidecar.rpc.provider import Provider
from sidecar.rpc.recovery import Recovery
from sidecar.rpc.retry import RetryPolicy
from sidecar.rpc.session import Draining, LedgerSession
from sidecar.seams import Seams
from sidecar.services.checkpoints import CheckpointService
from sidecar.services.lease_sweep import LeaseSweep
from sidecar.services.ledger import LedgerService
from sidecar.services.membership import MembershipService, daemon_id
from sidecar.services.operator import OperatorService
from sidecar.services.policy import PolicyService
from sidecar.services.recovery import RecoveryService
from sidecar.services.retention import RetentionService
from sidecar.services.retry import RetryService
from sidecar.storage import backends, marking
from sidecar.storage.api import ReportsFill, Store
from sidecar.storage.backends import Opening
from sidecar.storage.lmdb import restore
from sidecar.storage.scans import Scans

if TYPE_CHECKING:
    from sidecar.seams import Tracer

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
        raise ConfigError(("tokens_file", "tokens"), "set one, not both")
    if cfg.tokens_file is not None:
        return tokens.load_file(cfg.tokens_file)
    if cfg.tokens_text is not None:
        return tokens.parse(cfg.tokens_text)
    return None


def load_tracing(cfg: ServeConfig) -> Tracer | None:
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
            "otel", "needs the otel extra (pip install effectd[otel])"
        ) from None
    return otel.from_environment()


def open_store(
    cfg: ServeConfig, metrics: Metrics, failpoints: Failpoints | None = None
) -> Store:
    """The store of `cfg.data_dir`, or the shared store `cfg.store` names (its
    backend found in `storage.backends`), its commits counted by `metrics`,
    crashing at `failpoints` (a test build's); the caller holds the socket
    lock (the LMDB store takes the data directory's)."""
    opening = Opening(
        on_commit=metrics.commit_observed,
        failpoints=failpoints,
        sync=cfg.sync,
        map_size=cfg.map_size,
    )
    if cfg.store is not None:
        backend = backends.of_url(cfg.store)
        if backend is None:  # refused by the configuration before
            raise ConfigError("store", "no store backend takes this URL")
        password = url_password(cfg.store)
        if password:
            logs.add_secrets([password])
        log.info("opening the shared store %s", masked_url(cfg.store))
        return backend.entry().open(cfg.store, opening)
    refuse_unsafe_directory(cfg.data_dir, "data-dir", sticky_ok=False)
    try:
        restore.refuse_unfinished(cfg.data_dir)
    except marking.UnfinishedRestore as exc:
        raise ConfigError("data_dir", str(exc)) from None
    if not cfg.sync:
        log.warning(
            "sync is off (--no-sync): an answer can leave before its write "
            "is on disk, so after a power loss a call answered STARTED can "
            "be answered EXECUTE again and its side effect run twice"
        )
    return backends.DEFAULT.entry().open(str(cfg.data_dir), opening)


def _restore_marker(store: Store) -> Marker | None:
    """How the store was restored, said in the log at every start."""
    restored = store.read(marking.load_marker)
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
class Services:
    """Everything one daemon serves, wired over one store.

    A test may put a variant of one service in with `dataclasses.replace`
    (before `handlers`, which builds the servicers from these fields).
    """

    store: Store
    # The long reads of the store, on worker threads; closed before the store.
    scans: Scans
    restored: Marker | None
    credentials: Credentials | None
    policy: PolicySource
    ledger: LedgerService
    operator: OperatorService
    checkpoints: CheckpointService
    recovery: RecoveryService
    retry: RetryService
    policies: PolicyService
    retention: RetentionService
    lease_sweep: LeaseSweep
    # This daemon's registration among those sharing the store.
    membership: MembershipService
    monitor: ProviderMonitor
    provider: ProviderClient
    # Closed by the daemon when it stops.
    http: httpx.AsyncBaseTransport
    tracer: Tracer | None
    slots: Slots
    gate: Gate
    # Set when the daemon begins to stop: session streams end.
    draining: Draining


def compose(cfg: ServeConfig, seams: Seams, store: Store, metrics: Metrics) -> Services:
    """Reads the files `cfg` names and wires the services over `store`.

    Raises:
        ConfigError, PolicyError, ProvidersError: a file is unreadable or
            invalid (nothing is left open then).
    """
    clock = seams.clock
    restored = _restore_marker(store)
    credentials = load_credentials(cfg)
    if credentials is not None:
        logs.add_secret_digests(credentials.digests())
    policy: PolicySource = (
        FixedPolicy() if cfg.policy_file is None else PolicyFile(cfg.policy_file)
    )
    routes = {} if cfg.providers_file is None else load_providers(cfg.providers_file)
    logs.add_secrets(r.credential for r in routes.values() if r.credential)
    # Last of what can fail: its exporters may start threads.
    tracer = seams.tracer if seams.tracer is not None else load_tracing(cfg)
    # One pooled transport per daemon, with no client around it: redirects
    # are never followed (a 3xx is an answer), no cookie is kept, and the
    # environment's proxies, .netrc and certificate settings are ignored.
    # HTTP/2 is used where a TLS upstream offers it (ALPN).
    http = seams.transport or httpx.AsyncHTTPTransport(
        http2=True,
        trust_env=False,
        limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
    )
    budget = RetryBudget(clock)
    monitor = ProviderMonitor(routes, budget)
    limits = cfg.server_limits
    slots = Slots(limits.max_concurrent_rpcs, limits.max_concurrent_rpcs_per_caller)
    scans = Scans(store)
    return Services(
        store=store,
        scans=scans,
        restored=restored,
        credentials=credentials,
        policy=policy,
        ledger=LedgerService(
            store, clock, cfg.limits, policy, quotas=cfg.quotas, scans=scans
        ),
        operator=OperatorService(store, clock, cfg.limits, policy=policy, scans=scans),
        checkpoints=CheckpointService(store, clock, quotas=cfg.quotas, scans=scans),
        recovery=RecoveryService(store, clock, cfg.limits, policy, scans=scans),
        retry=RetryService(store, clock, policy, random=seams.random, scans=scans),
        policies=PolicyService(store, clock, policy),
        retention=RetentionService(store, clock, policy, scans=scans),
        lease_sweep=LeaseSweep(store, clock),
        membership=MembershipService(
            store,
            clock,
            daemon_id=daemon_id(cfg),
            ttl_seconds=cfg.registration_ttl_seconds,
            scans=scans,
        ),
        monitor=monitor,
        provider=ProviderClient(
            routes,
            http,
            clock,
            budget=budget,
            rng=seams.random,
            sleep=seams.backoff_sleep or clock.sleep,
            observer=monitor,
            limits=cfg.limits,
        ),
        http=http,
        tracer=tracer,
        slots=slots,
        gate=_gate(
            cfg,
            seams,
            credentials=credentials,
            tracer=tracer,
            metrics=metrics,
            slots=slots,
        ),
        draining=Draining(),
    )


def _gate(
    cfg: ServeConfig,
    seams: Seams,
    *,
    credentials: Credentials | None,
    tracer: Tracer | None,
    metrics: Metrics,
    slots: Slots,
) -> Gate:
    quotas = cfg.quotas
    # On the injected clock, as the leases are.
    admission = (
        RateLimiter.of(quotas, monotonic_seconds(seams.clock))
        if quotas.requests_per_second > 0
        else None
    )
    if credentials is None:
        log.warning(
            "authentication is off (no tokens-file, no EFFECTD_TOKENS): "
            "serving only the Unix socket%s",
            f" and loopback {cfg.listen}" if cfg.listen else "",
        )
    else:
        log.info("authentication is on: %d tokens", len(credentials))
    return Gate(
        credentials,
        admission=admission,
        observer=metrics,
        tracer=tracer,
        default_deadline=cfg.server_limits.default_deadline_seconds,
        slots=slots,
    )


def handlers(
    services: Services, cfg: ServeConfig
) -> tuple[grpc.GenericRpcHandler[Any, Any], ...]:
    """The gRPC servicers of `services`, one per entry of `SERVICES`."""
    store = services.store
    ledger, checkpoints, recovery, retry, admin, provider = SERVICES
    tool_ledger = ToolLedger(services.ledger, services.operator)
    return (
        generic_handler(
            ledger,
            tool_ledger,
            LedgerSession(
                tool_ledger,
                max_in_flight=cfg.server_limits.session_max_in_flight,
                draining=services.draining,
            ),
        ),
        generic_handler(checkpoints, Checkpoints(services.checkpoints, cfg.limits)),
        generic_handler(recovery, Recovery(services.recovery)),
        generic_handler(retry, RetryPolicy(services.retry, cfg.limits)),
        generic_handler(
            admin,
            Admin(
                services.operator,
                services.policies,
                backup=store.backup,
                quotas=cfg.quotas,
                incarnation=store.incarnation,
                fill=store.fill if isinstance(store, ReportsFill) else None,
                disk=data_disk(cfg),
                restored=services.restored,
                membership=services.membership,
            ),
        ),
        generic_handler(provider, Provider(services.provider)),
    )
