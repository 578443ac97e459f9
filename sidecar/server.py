"""The daemon's lifecycle.

Start: lock the socket, open the store (which locks the data directory),
wire the services (`sidecar.composition`), register this daemon's
incarnation (`services.membership`), settle calls left STARTED by an
incarnation that restarted, compact, bind, then report SERVING and start the
periodic work on the injected clock: renewing the registration, and the
settlement and retention passes, each run by whichever daemon sharing the
store claims it for the interval. Stop: health NOT_SERVING, stop accepting,
let in-flight calls finish within the grace period, end the registration,
then close what start opened. Constructing a `Daemon` does no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.clock import every
from sidecar.composition import SERVICES, Services, compose, handlers, server_options
from sidecar.config import ConfigError, ServeConfig, split_host_port
from sidecar.directories import (
    data_disk,
    make_private_directory,
    refuse_unsafe_directory,
)
from sidecar.errors import ShuttingDown
from sidecar.locking import ExclusiveLock
from sidecar.observability.metrics import Metrics, MetricsServer
from sidecar.rpc import tls
from sidecar.rpc.frames import FramesServer, serve_frames
from sidecar.rpc.summaries import summarize
from sidecar.seams import Seams
from sidecar.services.lease_sweep import SweepPass
from sidecar.services.membership import LEASE_SWEEP, RETENTION
from sidecar.services.policy import Reload
from sidecar.services.retention import PassResult
from sidecar.side_ports import log_serving, start_health_port, start_metrics
from sidecar.storage.api import Store
from sidecar.stores import ledger_to_create, open_store

if TYPE_CHECKING:
    from sidecar.seams import Tracer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a started daemon listens: gRPC targets for clients."""

    unix: str
    tcp: str | None


class Daemon:
    """One daemon: `start` opens, wires and serves; `stop` undoes it.

    Args:
        config: what to serve and how (validated here).
        seams: the clock, random source, provider transport and tracer
            (default: production's).
    """

    def __init__(self, config: ServeConfig, seams: Seams | None = None) -> None:
        config.validate()
        self.config = config
        self.seams = seams or Seams()
        self.metrics = Metrics()
        # Set by `start`, cleared by `stop`.
        self.services: Services | None = None
        self.endpoints: Endpoints | None = None
        self.health_address: str | None = None
        self.metrics_server: MetricsServer | None = None
        # HOST:PORT of /metrics once started (port 0 resolved), or None.
        self.metrics_address: str | None = None
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._frames: FramesServer | None = None
        self._health: health_aio.HealthServicer | None = None
        self._store: Store | None = None
        self._socket_lock: ExclusiveLock | None = None
        self._unwatch: list[Callable[[], None]] = []
        self._passes: list[asyncio.Task[None]] = []
        self._registered = False

    @property
    def tracing(self) -> Tracer | None:
        """The RPC tracer of the running daemon, if it has one."""
        return None if self.services is None else self.services.tracer

    def open_store(self) -> Store:
        """The store to serve; the socket lock is held."""
        return open_store(self.config, self.metrics, self.seams.failpoints, summarize)

    def compose(self, store: Store) -> Services:
        """The services over `store` (a test's subclass may replace one)."""
        return compose(self.config, self.seams, store, self.metrics)

    async def start(self) -> Endpoints:
        cfg = self.config
        sock = cfg.socket_path
        refuse_unsafe_directory(cfg.data_dir, "data-dir", sticky_ok=False)
        # Before anything is created: a data directory without a ledger is
        # refused unless a new one is asked for.
        ledger_to_create(cfg)
        setting = "data_dir" if cfg.socket is None else "socket"
        make_private_directory(sock.parent, setting)
        # The socket itself is 0600, but whoever may write its directory could
        # rename it and put a socket of their own in its place.
        refuse_unsafe_directory(sock.parent, "socket", sticky_ok=True)
        lock = sock.with_name(sock.name + ".lock")
        try:
            self._socket_lock = ExclusiveLock(lock, f"socket {sock}")
        except OSError as exc:
            raise ConfigError(
                setting, f"cannot create {lock}: {exc.strerror}"
            ) from None
        try:
            return await self._start()
        except BaseException:
            await self.stop(grace=0)
            raise

    async def _start(self) -> Endpoints:
        cfg = self.config
        store = self._store = self.open_store()
        self._unwatch.append(self.metrics.watch_store(store))
        self._unwatch.append(self.metrics.watch_disk(data_disk(cfg)))
        services = self.services = self.compose(store)
        self._unwatch.append(self.metrics.watch_provider(services.monitor))
        registered = await services.membership.register()
        self._registered = True
        for gone in registered.ended:
            if gone.ended_ns != registered.registration.registered_ns:
                continue  # it had stopped cleanly before
            log.info(
                "daemon %s (incarnation %d) ended by this start",
                gone.daemon_id,
                gone.incarnation,
            )
        settled = await services.ledger.settle_earlier_incarnations()
        if settled:
            log.warning("%d calls started before the restart are now UNKNOWN", settled)
        # contract §4.7: a compaction pass at start, then one per interval.
        await self.compact_expired()

        server = self._server = grpc.aio.server(
            interceptors=[services.gate],
            options=server_options(cfg),
            maximum_concurrent_rpcs=services.slots.backstop,
        )
        servicers = handlers(services, cfg)
        server.add_generic_rpc_handlers(servicers)
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
                    cfg.listen, tls.server_credentials(cfg, self.seams.clock)
                )
            else:
                port = server.add_insecure_port(cfg.listen)
            tcp = f"{host}:{port}"
        await server.start()
        os.chmod(sock, 0o600)
        limit = cfg.server_limits.max_message_bytes
        self._frames = await serve_frames(
            sock, services.gate, servicers, limit, serve=cfg.local_frames
        )
        self.health_address = await self._start_health_port(services)
        self._start_metrics()
        for name in ("", *names):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.endpoints = Endpoints(f"unix:{sock}", tcp)
        self._log_serving(services, store.incarnation)
        self._start_periodic_passes(services)
        return self.endpoints

    def _log_serving(self, services: Services, incarnation: int) -> None:
        assert self.endpoints is not None
        frames = self._frames
        log_serving(
            [
                self.endpoints.unix,
                self.endpoints.tcp or "",
                f"frames unix:{frames.path}" if frames else "",
                f"health {self.health_address}" if self.health_address else "",
                f"metrics http://{self.metrics_address}/metrics"
                if self.metrics_address
                else "",
            ],
            services,
            incarnation,
        )

    def _start_periodic_passes(self, services: Services) -> None:
        # On the injected clock, as the leases and the retention window are.
        clock = self.seams.clock
        cfg = self.config
        membership = services.membership
        self._passes = [
            asyncio.create_task(
                every(clock, membership.renew_interval_seconds, self.renew),
                name="effectd-registration",
            ),
            asyncio.create_task(
                every(clock, cfg.retention_interval_seconds, self.compact_expired),
                name="effectd-retention",
            ),
            asyncio.create_task(
                every(clock, cfg.settle_interval_seconds, self.sweep_leases),
                name="effectd-lease-sweep",
            ),
        ]

    async def _start_health_port(self, services: Services) -> str | None:
        if self.config.health_listen is None or self._health is None:
            return None
        server, address = await start_health_port(
            self.config.health_listen, services.gate, self._health
        )
        self._health_server = server
        return address

    def _start_metrics(self) -> None:
        if self.config.metrics_listen is not None:
            self.metrics_server = start_metrics(
                self.metrics, self.config.metrics_listen
            )
            self.metrics_address = self.metrics_server.address

    async def _claim(self, name: str, interval_seconds: float) -> bool:
        """Whether this daemon runs the pass `name` now (one daemon sharing
        the store runs it per interval); a failure to claim is logged."""
        if self.services is None:
            return False
        try:
            return await self.services.membership.claim(name, interval_seconds)
        except Exception:
            log.exception("claiming the %s pass failed; it is skipped", name)
            return False

    async def renew(self) -> None:
        """Renews this daemon's registration; a failure is logged, and the
        next renewal tries again (the registration lapses if none succeeds
        within its lifetime)."""
        if self.services is None:
            return
        try:
            await self.services.membership.renew()
        except Exception:
            log.exception("renewing this daemon's registration failed")

    async def compact_expired(self) -> PassResult | None:
        """One compaction pass of the retention window (contract §4.7), unless
        another daemon sharing the store runs it this interval (None then);
        a failure is logged and leaves every record in place."""
        if not await self._claim(RETENTION, self.config.retention_interval_seconds):
            return None
        assert self.services is not None
        try:
            done = await self.services.retention.compact()
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

    async def sweep_leases(self) -> SweepPass | None:
        """One lease sweep, unless another daemon sharing the store runs
        it this interval (None then): STARTED calls whose lease ran out, or
        whose daemon's registration lapsed, become UNKNOWN; registrations gone
        for long are deleted. A failure is logged, and the next pass tries
        again."""
        if not await self._claim(LEASE_SWEEP, self.config.settle_interval_seconds):
            return None
        assert self.services is not None
        try:
            done = await self.services.lease_sweep.sweep()
        except Exception:
            log.exception("the lease sweep failed; no call was settled")
            return None
        try:
            await self.services.membership.forget_gone()
        except Exception:
            log.exception("deleting the registrations gone for long failed")
        if done.settled:
            log.warning(
                "%d STARTED calls whose lease ran out are now UNKNOWN", done.settled
            )
        return done

    async def _deregister(self, services: Services) -> None:
        """Ends this daemon's registration, once, if start made it: from now
        the calls it held are settled by the next daemon that touches them."""
        if not self._registered:
            return
        self._registered = False
        try:
            await services.membership.deregister()
        except Exception:
            log.exception("ending this daemon's registration failed")

    async def reload_policy(self, actor: str, reason: str = "") -> Reload:
        """Reloads the policy file with its audit entry (ADR-010 R2); see
        `PolicyService.reload` for the refusals."""
        if self.services is None:
            raise ShuttingDown("the daemon is not serving")
        return await self.services.policies.reload(actor=actor, reason=reason)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def _stop_listeners(self, grace: float) -> None:
        """The framed transport's and gRPC's: what is in flight is answered
        within `grace` seconds."""
        if self._frames is not None:
            await self._frames.stop(grace)
            self._frames = None
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.config.socket_path.unlink()

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop; safe to call more than once."""
        grace = self.config.grace_seconds if grace is None else grace
        for task in self._passes:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._passes = []
        # No pass or reload starts from here on; calls in flight finish.
        services, self.services = self.services, None
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if services is not None:
            # Session streams answer what they have in flight, then end.
            services.draining.begin()
        await self._stop_listeners(grace)
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None
        if services is not None:
            await self._deregister(services)
            await services.http.aclose()
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.close)
            self.metrics_server = None
        if services is not None and services.tracer is not None:
            # Exports the spans still queued (bounded by the SDK's timeout).
            await asyncio.to_thread(services.tracer.close)
        # Waits for a scrape reading the store; no later one reads it.
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch.clear()
        if services is not None:
            # No scan's thread may read the store as it closes.
            await services.scans.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._socket_lock is not None:
            self._socket_lock.release()
            self._socket_lock = None
