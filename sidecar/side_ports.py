"""The daemon's side ports, beside its gRPC listeners: a plaintext port
serving only grpc.health.v1 for probes, and the Prometheus endpoint; and
the line that names every listener once the daemon serves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2_grpc

from sidecar.config import is_loopback, split_host_port
from sidecar.observability.metrics import Metrics, MetricsServer, serve_metrics

if TYPE_CHECKING:
    from sidecar.composition import Services

log = logging.getLogger("sidecar.server")


def log_serving(listeners: list[str], services: Services, incarnation: int) -> None:
    """Every listener (ports asked as 0 as bound; empty ones left out) and
    the provider routes, in one line."""
    listening = [x for x in listeners if x]
    routes = services.provider.route_names
    log.info(
        "effectd serving on %s (daemon %s, incarnation %d); provider routes: %s",
        ", ".join(listening),
        services.membership.daemon_id,
        incarnation,
        ", ".join(routes) or "none",
        extra={"listeners": listening, "routes": list(routes)},
    )


async def start_health_port(
    listen: str, gate: Any, health: health_aio.HealthServicer
) -> tuple[grpc.aio.Server, str]:
    """A plaintext port serving only grpc.health.v1, for probes that can
    bring neither credentials nor a Unix socket (Kubernetes). Through the
    gate, as the main port: its Watch streams share the main port's pool
    and its bound per peer. The server and its address (a port asked as 0
    as bound)."""
    server = grpc.aio.server(interceptors=[gate], options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    host, _ = split_host_port("health-listen", listen)
    port = server.add_insecure_port(listen)
    await server.start()
    return server, f"{host}:{port}"


def start_metrics(metrics: Metrics, listen: str) -> MetricsServer:
    """The Prometheus endpoint on `listen`, warned about when others may
    reach it."""
    host, port = split_host_port("metrics-listen", listen)
    server = serve_metrics(metrics, host, port)
    if not is_loopback(host):
        log.warning(
            "metrics on %s answer anyone who reaches them, without "
            "authentication: restrict who may (a NetworkPolicy, a firewall)",
            server.address,
        )
    return server
