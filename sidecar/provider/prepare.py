"""A provider request made ready to send, once (contract §9).

`prepare` looks the route up once and checks every field of a `Request`
(INVALID_REQUEST names every bad one; a header the sidecar or the route sets
itself is refused), then the path against the route (ROUTE_NOT_ALLOWED). It
builds what every attempt sends: the agent's headers without its own
credentials or Idempotency-Key, the route's headers and credential, one
Idempotency-Key for all the attempts, the W3C trace context, and the
deadline that covers them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from effectd_client import is_hop_by_hop
from sidecar import tracecontext as trace
from sidecar.clock import Clock
from sidecar.ledger.validation import Limits, Violations
from sidecar.provider import policy
from sidecar.provider.messages import Headers, Request
from sidecar.provider.routes import (
    Locations,
    Route,
    RouteEffect,
    is_field_value,
    locate,
)

METHODS = frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"})
MAX_HEADERS = 100
MAX_PATH_BYTES = 8192
MAX_CLIENT_RETRIES = 100
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
CONNECT_TIMEOUT = 5.0
# Answer before the gRPC deadline passes, so the agent gets our status.
REPLY_MARGIN = 0.05
# Every upstream request carries these unless its own headers set them: an
# httpx client's defaults, spelled out. Attempts go straight to the pooled
# transport: no client merges headers, URLs and cookies per request, and no
# cookie jar carries one agent's upstream cookies into another's requests.
DEFAULT_HEADERS = (
    ("Accept", "*/*"),
    ("Accept-Encoding", "gzip, deflate"),
    ("Connection", "keep-alive"),
    ("User-Agent", f"python-httpx/{httpx.__version__}"),
)
# Set by the sidecar, with the hop-by-hop headers (the list the client's
# transports share) and any proxy-*.
SIDECAR_HEADERS = frozenset({"host", "content-length"})
# An agent's own credentials: never sent upstream, whatever header the route
# puts its credential in (contract §9: provider keys live in the sidecar).
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "ocp-apim-subscription-key",
        "cookie",
    }
)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request as every one of its attempts sends it."""

    route: Route
    url: httpx.URL
    method: str
    headers: Headers
    body: bytes
    key: str
    max_retries: int
    replay_safe: bool
    deadline_ns: int

    def left(self, clock: Clock) -> float:
        """Seconds an attempt or a wait may still take."""
        return (self.deadline_ns - clock.monotonic_ns()) / 1e9 - REPLY_MARGIN

    def build(self, left: float) -> httpx.Request:
        """One attempt's HTTP request, its timeouts bounded by `left`."""
        read = min(self.route.read_timeout, left)
        connect = min(CONNECT_TIMEOUT, left)
        timeout = {"connect": connect, "read": read, "write": read, "pool": connect}
        return httpx.Request(
            self.method,
            self.url,
            headers=self.headers,
            content=self.body,
            extensions={"timeout": timeout},
        )


def _sidecars(name: str) -> bool:
    return is_hop_by_hop(name) or name in SIDECAR_HEADERS or name.startswith("proxy-")


def _check_headers(
    v: Violations, headers: Headers, own: frozenset[str], limits: Limits
) -> None:
    if len(headers) > MAX_HEADERS:
        v.add("headers", f"must be at most {MAX_HEADERS} headers")
    for i, (name, value) in enumerate(headers[:MAX_HEADERS]):
        lowered = name.lower()
        if not _TOKEN.match(name):
            v.add(f"headers[{i}].name", "must be an HTTP header name")
        elif _sidecars(lowered):
            v.add(f"headers[{i}].name", "is set by the sidecar, not by requests")
        elif lowered in own:
            v.add(f"headers[{i}].name", "is set by the route, not by requests")
        if not is_field_value(value) or len(value) > limits.max_text_bytes:
            v.add(
                f"headers[{i}].value",
                f"must be one line of at most {limits.max_text_bytes} bytes of "
                "visible ASCII, spaces and tabs",
            )


def check(request: Request, route: Route | None, limits: Limits) -> str:
    """The request's method, upper-cased; INVALID_REQUEST lists every bad
    field. `route` is the request's route, when it names one."""
    own = route.own_headers if route is not None else frozenset()
    v = Violations()
    v.text_id("route", request.route, limits.max_id_bytes)
    method = request.method.upper() or "POST"
    if method not in METHODS:
        v.add("method", f"must be one of {', '.join(sorted(METHODS))}")
    if not request.path:
        v.add("path", "is required")
    elif len(request.path.encode()) > MAX_PATH_BYTES:
        v.add("path", f"must be at most {MAX_PATH_BYTES} bytes")
    _check_headers(v, request.headers, own, limits)
    if request.max_retries is not None and request.max_retries > MAX_CLIENT_RETRIES:
        v.add("max_retries", f"must be at most {MAX_CLIENT_RETRIES}")
    if request.client_retry_count > MAX_CLIENT_RETRIES:
        v.add("client_retry_count", f"must be at most {MAX_CLIENT_RETRIES}")
    # Sent as the Idempotency-Key header by a route that honours one.
    key = request.idempotency_key
    if len(key) > limits.max_key_bytes:
        v.add("idempotency_key", f"must be at most {limits.max_key_bytes} bytes")
    elif not is_field_value(key):
        v.add("idempotency_key", "must be one line of visible ASCII, spaces and tabs")
    v.require()
    return method


def prepare(
    routes: Mapping[str, Route],
    request: Request,
    limits: Limits,
    clock: Clock,
    timeout: float | None,
    *,
    locations: Locations | None = None,
) -> Prepared:
    """The checked request, ready to send; `timeout` is the seconds left of
    the caller's deadline (None: 600 s); `locations` remembers the paths
    allowed before."""
    found = routes.get(request.route)
    method = check(request, found, limits)
    where = locate if locations is None else locations.locate
    route, url = where(found, request.route, request.path)
    lowered = {n.lower(): v for n, v in request.headers}
    key = request.idempotency_key or lowered.get("idempotency-key", "")
    key = key or str(uuid.uuid4())
    headers = [
        (n, v)
        for n, v in request.headers
        if n.lower() != "idempotency-key" and n.lower() not in CREDENTIAL_HEADERS
    ]
    headers += list(route.headers.items())
    if route.credential_header:
        headers.append((route.credential_header, route.credential))
    if route.honours_idempotency_key:
        headers.append(("Idempotency-Key", key))
    context = trace.current()
    if context is not None and trace.TRACEPARENT not in lowered:
        # W3C Trace Context: the upstream's spans join the agent's trace.
        # One child for the logical request, its retries included.
        headers += [(n, v) for n, v in context.child().headers() if n not in lowered]
    named = {n.lower() for n, _ in headers}
    headers[:0] = [(n, v) for n, v in DEFAULT_HEADERS if n.lower() not in named]
    inbound = policy.inbound_retry_count(request.client_retry_count, lowered)
    seconds = policy.DEFAULT_DEADLINE_SECONDS if timeout is None else timeout
    return Prepared(
        route=route,
        url=url,
        method=method,
        headers=tuple(headers),
        body=request.body,
        key=key,
        max_retries=policy.effective_max_retries(
            request.max_retries, route.max_retries, inbound
        ),
        # ADR-010 D4: model inference is retried after an ambiguous failure
        # (with the route's Idempotency-Key where it honours one); a
        # side-effect route is not (provider-retries §12.3).
        replay_safe=route.effect is RouteEffect.INFERENCE,
        deadline_ns=clock.monotonic_ns() + int(max(0.0, seconds) * 1e9),
    )


__all__ = [
    "CREDENTIAL_HEADERS",
    "DEFAULT_HEADERS",
    "METHODS",
    "SIDECAR_HEADERS",
    "Prepared",
    "check",
    "prepare",
]
