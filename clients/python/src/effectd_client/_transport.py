"""httpx transports that send every request through effectd's Provider service.

    http = httpx.Client(transport=EffectdTransport(target, route="openai"))
    llm = openai.OpenAI(
        base_url="http://effectd/v1", api_key="unused", http_client=http,
        timeout=30,
    )

The host of the request URL is ignored: its path and query become the path
below the route's base URL, and the method, headers and body are sent as
they are, except hop-by-hop headers, Host, Content-Length, credential headers
(`Authorization`, `x-api-key`, `api-key`: the sidecar holds the credential)
and any `drop_headers` (the headers the route injects itself).

Unary or stream: a request goes through ProviderStream when its `Accept`
header names `text/event-stream` or its body is a JSON object whose
`"stream"` is `true`; every other request through ProviderCall. A stream's
response yields the server-sent events, re-encoded, as they arrive.

Deadline: the request's read timeout (what an SDK's `timeout=` sets) is the
call's gRPC deadline, bounded by the transport's `timeout`; it covers the
sidecar's retries and a whole stream, and the upstream request is closed
when it passes. A plain `httpx.Client` brings httpx's default of 5 s.

The sidecar retries (one bounded policy) and the SDK must not send again
what the sidecar decided: every answer carries `x-should-retry: false` (any
upstream value is replaced), which the openai and anthropic SDKs obey at
their default `max_retries`, and, unless it is a stream still open, the
upstream requests it took as `x-effectd-attempts`.

Failures: the upstream's HTTP answer, whatever its status, is the response.
A call the sidecar ended without any upstream answer is answered too, never
raised (an SDK retries every exception a transport raises): 502 (no
upstream answer, UPSTREAM_UNAVAILABLE), 503 (the route's retry budget,
RETRY_BUDGET_EXHAUSTED, with `retry-after-ms`) or 504 (the deadline passed),
with `x-should-retry: false`, the reason as `x-effectd-reason`, the
attempts when known and a JSON error body. Only a call the daemon took no
decision on raises `httpx.ConnectError`, the `EffectdError` as its
`__cause__`: a refused route or request, no daemon, or a daemon gone
mid-call (the sidecar subtracts an SDK's retries of it, counted in
`x-stainless-retry-count`, from its own). A stream that breaks
after its first event (never retried, never replayed) raises
`httpx.RemoteProtocolError` from the response stream, with the sidecar's
explanation.

`EffectdTransport` and `AsyncEffectdTransport` are for `httpx`;
`Httpx2EffectdTransport` and `AsyncHttpx2EffectdTransport` the same for
`httpx2` clients (SDKs such as `anthropic` 2 accept only an `httpx2.Client`;
httpx2 is imported on first use). They are one implementation, sync and
async, over a `Flavour` record of what differs between the two libraries
(`effectd_client._flavours`, where internal failures become the library's
errors at one boundary); the messages are built and read, sans I/O, by
`effectd_client._provider`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Self, TypeVar

import grpc
import httpx
from effectd.v1 import provider_pb2 as pb
from effectd.v1 import provider_pb2_grpc

from effectd_client import _provider as wire
from effectd_client._channel import DEFAULT_MAX_MESSAGE_BYTES, Connection, connection
from effectd_client._flavours import HTTPX, Flavour, httpx2_flavour, mapped

if TYPE_CHECKING:
    import httpx2
    from httpx2 import AsyncBaseTransport as _AsyncHttpx2Base
    from httpx2 import BaseTransport as _Httpx2Base
else:
    _Httpx2Base = _AsyncHttpx2Base = object

R = TypeVar("R")
Req = TypeVar("Req", bound="httpx.Request | httpx2.Request")


class _Transport(Generic[Req, R]):
    """What every transport shares: its options, and the request it sends."""

    def __init__(
        self,
        target: str | Connection,
        *,
        route: str,
        timeout: float | None = None,
        max_retries: int | None = None,
        drop_headers: Iterable[str] = (),
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._connection = connection(
            target,
            token=token,
            tls=tls,
            root_certificates=root_certificates,
            certificate_chain=certificate_chain,
            private_key=private_key,
            max_message_bytes=max_message_bytes,
        )
        self._metadata = self._connection.metadata
        self._options = wire.options(route, timeout, max_retries, drop_headers)
        self._open()

    def _open(self) -> None:
        """Opens what the flavour opens at once."""

    def _flavour(self) -> Flavour[R]:
        raise NotImplementedError

    def _request(
        self, request: Req, body: bytes
    ) -> tuple[pb.ProviderRequest, float | None, bool]:
        """The ProviderRequest, its deadline, and whether it is a stream."""
        headers = request.headers.multi_items()
        msg = self._options.request(request.method, request.url.raw_path, headers, body)
        deadline = self._options.deadline(wire.read_timeout(request.extensions))
        return msg, deadline, wire.wants_stream(headers, body)


class _SyncTransport(_Transport[Req, R]):
    def _open(self) -> None:
        self._channel = self._connection.channel()
        self._stub = provider_pb2_grpc.ProviderStub(self._channel)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.close()

    def handle_request(self, request: Req) -> R:
        flavour = self._flavour()
        body = request.read()
        with mapped(flavour, request):
            answer, chunks, cancel = self._exchange(request, body)
        if chunks is None:
            return flavour.respond(answer, None)
        return flavour.respond(
            answer, flavour.sync_stream(flavour, request, chunks, cancel)
        )

    def _exchange(
        self, request: Req, body: bytes
    ) -> tuple[wire.Answer, Iterator[bytes] | None, Callable[[], None]]:
        """The answer; for an open stream also its remaining bytes and how
        to cancel it."""
        req, timeout, stream = self._request(request, body)
        try:
            if not stream:
                msg = self._stub.ProviderCall(
                    req, timeout=timeout, metadata=self._metadata
                )
                return wire.unary(msg), None, wire.nothing
            call = self._stub.ProviderStream(
                req, timeout=timeout, metadata=self._metadata
            )
            messages: Iterator[pb.ProviderStreamMessage] = iter(call)
            first = next(messages)
        except grpc.RpcError as exc:
            return wire.decided(exc), None, wire.nothing
        except StopIteration:
            raise wire.Failed("effectd: the stream ended at once") from None
        answer = wire.opening(first)
        cancel: Callable[[], None] = call.cancel
        if answer.body is not None:
            cancel()
            return answer, None, wire.nothing
        return answer, wire.sync_chunks(first, messages), cancel

    def close(self) -> None:
        self._channel.close()


class _AsyncTransport(_Transport[Req, R]):
    # Made on first use: an aio channel belongs to the running loop.
    _channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()

    async def handle_async_request(self, request: Req) -> R:
        flavour = self._flavour()
        body = await request.aread()
        with mapped(flavour, request):
            answer, chunks, cancel = await self._exchange(request, body)
        if chunks is None:
            return flavour.respond(answer, None)
        return flavour.respond(
            answer, flavour.async_stream(flavour, request, chunks, cancel)
        )

    async def _exchange(
        self, request: Req, body: bytes
    ) -> tuple[wire.Answer, AsyncIterator[bytes] | None, Callable[[], None]]:
        req, timeout, stream = self._request(request, body)
        if self._channel is None:
            self._channel = self._connection.aio_channel()
        stub = provider_pb2_grpc.ProviderStub(self._channel)
        try:
            if not stream:
                msg = await stub.ProviderCall(
                    req, timeout=timeout, metadata=self._metadata
                )
                return wire.unary(msg), None, wire.nothing
            call = stub.ProviderStream(req, timeout=timeout, metadata=self._metadata)
            messages = aiter(call)
            first = await anext(messages, None)
        except grpc.RpcError as exc:
            return wire.decided(exc), None, wire.nothing
        if first is None:
            raise wire.Failed("effectd: the stream ended at once")
        answer = wire.opening(first)

        def cancel() -> None:
            call.cancel()

        if answer.body is not None:
            cancel()
            return answer, None, wire.nothing
        return answer, wire.async_chunks(first, messages), cancel

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None


# -- the public transports ----------------------------------------------------


class EffectdTransport(
    _SyncTransport[httpx.Request, httpx.Response], httpx.BaseTransport
):
    """An `httpx.Client` transport: each request is one ProviderCall or
    ProviderStream on `route` of the daemon at `target`, a `Connection` or
    its target string (`unix:PATH` or `HOST:PORT`).

    `timeout`: an upper bound in seconds of each call's gRPC deadline, which
    is the request's own read timeout (None: the request's alone; neither:
    the daemon's default deadline). `max_retries`: lowers the route's retry
    cap. `drop_headers`: more request headers not to send (those the route
    injects itself, which the sidecar refuses). With a target string,
    `token`, `tls`, `root_certificates`, `certificate_chain`, `private_key`
    and `max_message_bytes` are the `Connection`'s options.
    """

    def _flavour(self) -> Flavour[httpx.Response]:
        return HTTPX


class AsyncEffectdTransport(
    _AsyncTransport[httpx.Request, httpx.Response], httpx.AsyncBaseTransport
):
    """`EffectdTransport` for an `httpx.AsyncClient` (grpc.aio); make and
    use it inside a running event loop."""

    def _flavour(self) -> Flavour[httpx.Response]:
        return HTTPX


class Httpx2EffectdTransport(
    _SyncTransport["httpx2.Request", "httpx2.Response"], _Httpx2Base
):
    """`EffectdTransport` for an `httpx2.Client`."""

    def _flavour(self) -> Flavour[httpx2.Response]:
        return httpx2_flavour()


class AsyncHttpx2EffectdTransport(
    _AsyncTransport["httpx2.Request", "httpx2.Response"], _AsyncHttpx2Base
):
    """`AsyncEffectdTransport` for an `httpx2.AsyncClient`."""

    def _flavour(self) -> Flavour[httpx2.Response]:
        return httpx2_flavour()


__all__ = [
    "AsyncEffectdTransport",
    "AsyncHttpx2EffectdTransport",
    "EffectdTransport",
    "Httpx2EffectdTransport",
]
