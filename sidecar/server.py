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
from collections.abc import Callable
from dataclasses import dataclass

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

from sidecar.clock import Clock, SystemClock
from sidecar.config import ServeConfig, split_host_port
from sidecar.errors import ShuttingDown
from sidecar.ledger.policy import FixedPolicy, PolicySource
from sidecar.locking import ExclusiveLock
from sidecar.policy_file import PolicyFile
from sidecar.provider.client import ProviderClient, Sleep
from sidecar.provider.routes import Route, load_providers
from sidecar.rpc.admin import Admin
from sidecar.rpc.checkpoints import Checkpoints
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
from sidecar.storage.api import Store
from sidecar.storage.lmdb_store import LmdbOptions, LmdbStore

log = logging.getLogger(__name__)

SERVICES = (
    ledger_pb2.DESCRIPTOR.services_by_name["ToolLedger"],
    checkpoints_pb2.DESCRIPTOR.services_by_name["Checkpoints"],
    recovery_pb2.DESCRIPTOR.services_by_name["Recovery"],
    retry_pb2.DESCRIPTOR.services_by_name["RetryPolicy"],
    admin_pb2.DESCRIPTOR.services_by_name["Admin"],
    provider_pb2.DESCRIPTOR.services_by_name["Provider"],
)


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
        self._health: health_aio.HealthServicer | None = None
        self._store: Store | None = None
        self._socket_lock: ExclusiveLock | None = None
        self.endpoints: Endpoints | None = None
        self._retention: RetentionService | None = None
        self._retention_task: asyncio.Task[None] | None = None
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
        # Seams of the provider proxy: the HTTP transport (None: httpx's own
        # pooled one) and the sleep between retries.
        self.provider_transport: httpx.AsyncBaseTransport | None = None
        self.provider_sleep: Sleep = asyncio.sleep
        self._http: httpx.AsyncClient | None = None
        self.provider: ProviderClient | None = None

    def open_store(self) -> Store:
        options = LmdbOptions(map_size=self.config.map_size, sync=self.config.sync)
        return LmdbStore(self.config.data_dir, options)

    def make_ledger(self, store: Store) -> LedgerService:
        return LedgerService(store, self._clock, self.config.limits, self.policy)

    def make_operator(self, store: Store) -> OperatorService:
        return OperatorService(store, self._clock, self.config.limits)

    async def start(self) -> Endpoints:
        cfg = self.config
        sock = cfg.socket_path
        sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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
        ledger = self.make_ledger(store)
        settled = await ledger.settle_earlier_incarnations()
        if settled:
            log.warning("%d calls started before the restart are now UNKNOWN", settled)
        self._retention = RetentionService(store, self._clock, self.policy)
        # DESIGN §4: a compaction pass at start, then one per interval.
        await self.compact_expired()
        self._policies = PolicyService(store, self._clock, self.policy)

        server = self._server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.max_send_message_length", cfg.max_message_bytes),
            ]
        )
        operator = self.make_operator(store)
        server.add_generic_rpc_handlers(
            (
                generic_handler(SERVICES[0], ToolLedger(ledger, operator)),
                generic_handler(
                    admin_pb2.DESCRIPTOR.services_by_name["Admin"],
                    Admin(operator, self._policies, backup=store.backup),
                ),
                generic_handler(
                    SERVICES[1],
                    Checkpoints(CheckpointService(store, self._clock), cfg.limits),
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
        self.provider = ProviderClient(
            self.routes,
            self._http,
            self._clock,
            rng=self.retry_random,
            sleep=self.provider_sleep,
        )
        server.add_generic_rpc_handlers(
            (
                generic_handler(
                    provider_pb2.DESCRIPTOR.services_by_name["Provider"],
                    Provider(self.provider, cfg.limits),
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
            port = server.add_insecure_port(cfg.listen)
            tcp = f"{host}:{port}"
        await server.start()
        os.chmod(sock, 0o600)
        for name in ("", *names):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.endpoints = Endpoints(f"unix:{sock}", tcp)
        log.info(
            "effectd serving on %s%s (incarnation %d)",
            self.endpoints.unix,
            f" and {tcp}" if tcp else "",
            store.incarnation,
        )
        self._retention_task = asyncio.create_task(
            self._retention_loop(), name="effectd-retention"
        )
        return self.endpoints

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
        return done

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_interval_seconds)
            await self.compact_expired()

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
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.config.socket_path.unlink()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._socket_lock is not None:
            self._socket_lock.release()
            self._socket_lock = None
