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
httpx2 is imported on first use).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import grpc
import httpx
from effectd.v1 import provider_pb2 as pb
from effectd.v1 import provider_pb2_grpc

from effectd_client._channel import DEFAULT_MAX_MESSAGE_BYTES, Connection, connection
from effectd_client._errors import EffectdError

if TYPE_CHECKING:
    import httpx2
    from httpx2 import AsyncBaseTransport as _AsyncHttpx2Base
    from httpx2 import BaseTransport as _Httpx2Base
else:
    _Httpx2Base = _AsyncHttpx2Base = object

# Never sent: the sidecar refuses them, or sets them itself.
_NOT_SENT = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        # credentials: the route's own, added by the sidecar
        "authorization",
        "x-api-key",
        "api-key",
    }
)
# Not answered: the body is answered whole and decoded.
_NOT_ANSWERED = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "x-should-retry"}
)

# The sidecar's decisions about a request it sent, or may have sent, upstream
# without an HTTP answer to show: answered as HTTP with `x-should-retry:
# false`, never raised. The SDKs (openai, anthropic) retry every exception a
# transport raises, whatever that header says, so a raised error would send
# the request upstream again after the sidecar decided not to.
_DECIDED = {
    "UPSTREAM_UNAVAILABLE": 502,
    "RETRY_BUDGET_EXHAUSTED": 503,
    "UPSTREAM_DEADLINE_EXCEEDED": 504,
    # The call's deadline passed before the daemon answered: it covers every
    # attempt the sidecar made.
    "DEADLINE_EXCEEDED": 504,
}


class _Failed(Exception):
    """Internal: the daemon took no decision about the upstream (it could not
    be reached, or refused the request); the flavour raises its own error."""


class _Broken(Exception):
    """Internal: a stream ended by a failure after its commit point."""


def wants_stream(headers: Iterable[tuple[str, str]], body: bytes) -> bool:
    """The rule: `Accept` names text/event-stream, or the body is a JSON
    object with `"stream": true`."""
    for name, value in headers:
        if name.lower() == "accept" and "text/event-stream" in value.lower():
            return True
    if not body.lstrip().startswith(b"{"):
        return False
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("stream") is True


def _read_timeout(extensions: Mapping[str, object]) -> float | None:
    """The read timeout of an httpx or httpx2 request (`timeout=3` in an SDK
    makes it 3): the longest its caller waits for the answer; None: none."""
    timeout = extensions.get("timeout")
    if not isinstance(timeout, Mapping):
        return None
    read = timeout.get("read")
    if isinstance(read, bool) or not isinstance(read, int | float):
        return None
    return float(read) if math.isfinite(read) else None


@dataclass(frozen=True, slots=True)
class _Options:
    route: str
    timeout: float | None
    max_retries: int | None
    drop: frozenset[str]

    def deadline(self, requested: float | None) -> float | None:
        """The call's gRPC deadline: the request's own timeout, bounded by
        the transport's."""
        given = [t for t in (self.timeout, requested) if t is not None]
        return min(given, default=None)

    def request(
        self,
        method: str,
        raw_path: bytes,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> pb.ProviderRequest:
        msg = pb.ProviderRequest(
            route=self.route,
            method=method,
            path=raw_path.decode("ascii"),
            headers=[
                pb.Header(name=n, value=v)
                for n, v in headers
                if n.lower() not in _NOT_SENT
                and n.lower() not in self.drop
                and not n.lower().startswith("proxy-")
            ],
            body=body,
        )
        if self.max_retries is not None:
            msg.max_retries = self.max_retries
        return msg


def _options(
    route: str,
    timeout: float | None,
    max_retries: int | None,
    drop_headers: Iterable[str],
) -> _Options:
    return _Options(
        route=route,
        timeout=timeout,
        max_retries=max_retries,
        drop=frozenset(h.lower() for h in drop_headers),
    )


def _headers(
    headers: Sequence[pb.Header], attempts: int | None
) -> list[tuple[str, str]]:
    """The answer's headers; the attempt count is known unless a stream is
    still open."""
    out = [(h.name, h.value) for h in headers if h.name.lower() not in _NOT_ANSWERED]
    out.append(("x-should-retry", "false"))
    if attempts is not None:
        out.append(("x-effectd-attempts", str(attempts)))
    return out


def _sse(events: Sequence[pb.SseEvent]) -> bytes:
    """Events re-encoded; `message`, the default type, is left implicit."""
    out: list[str] = []
    for e in events:
        if e.event and e.event != "message":
            out.append(f"event: {e.event}\n")
        if e.id:
            out.append(f"id: {e.id}\n")
        out.extend(f"data: {line}\n" for line in e.data.split("\n"))
        out.append("\n")
    return "".join(out).encode()


def _failure(exc: grpc.RpcError) -> _Failed:
    err = EffectdError.from_rpc_error(exc)
    failed = _Failed(f"effectd: {err}")
    failed.__cause__ = err
    return failed


def _decided(exc: grpc.RpcError) -> _Answer:
    """The answer of a call the sidecar ended without an upstream answer;
    raises `_Failed` when the daemon decided nothing about the upstream."""
    err = EffectdError.from_rpc_error(exc)
    reason = err.reason or err.code.name
    status = _DECIDED.get(reason)
    if status is None:
        raise _failure(exc)
    error = {"type": reason.lower(), "code": reason, "message": f"effectd: {err}"}
    headers = [
        ("content-type", "application/json"),
        ("x-should-retry", "false"),
        ("x-effectd-reason", reason),
    ]
    if "attempts" in err.metadata:
        headers.append(("x-effectd-attempts", err.metadata["attempts"]))
    if err.retry_delay is not None:
        headers.append(("retry-after-ms", str(round(err.retry_delay * 1000))))
    body = json.dumps({"type": "error", "error": error}).encode()
    return _Answer(status, headers, body)


def _broken(end: pb.StreamEnd) -> _Broken | None:
    if not (end.committed and end.error):
        return None
    return _Broken(
        f"effectd: the upstream stream failed after {end.events_delivered} "
        f"events ({end.error}; {pb.StopReason.Name(end.stop_reason)}); "
        "a committed stream is never retried or replayed"
    )


@dataclass(slots=True)
class _Answer:
    """What every flavour turns into its response."""

    status: int
    headers: list[tuple[str, str]]
    # Whole: the body. Streamed: None, and `chunks` yields it.
    body: bytes | None


def _unary(msg: pb.ProviderResponse) -> _Answer:
    return _Answer(msg.status, _headers(msg.headers, len(msg.attempts)), msg.body)


def _first(msg: pb.ProviderStreamMessage) -> _Answer:
    """The answer of a stream's first message; its body when the stream
    ended in it (a non-2xx answer, an error event)."""
    if not msg.HasField("head"):
        raise _Failed("effectd: the stream began without its head")
    attempts = len(msg.end.attempts) if msg.HasField("end") else None
    answer = _Answer(msg.head.status, _headers(msg.head.headers, attempts), None)
    if msg.HasField("end") and _broken(msg.end) is None:
        answer.body = _sse(msg.events) + msg.end.body
    return answer


def _tail(msg: pb.ProviderStreamMessage) -> tuple[bytes, bool]:
    """The bytes of one message and whether it was the last; raises `_Broken`."""
    data = _sse(msg.events)
    if not msg.HasField("end"):
        return data, False
    broken = _broken(msg.end)
    if broken is not None:
        raise _BrokenAfter(data, broken)
    return data + msg.end.body, True


class _BrokenAfter(Exception):
    """Internal: the last bytes before a `_Broken`."""

    def __init__(self, data: bytes, broken: _Broken) -> None:
        super().__init__(str(broken))
        self.data = data
        self.broken = broken


# -- the gRPC side, sync and async ------------------------------------------


class _SyncCore:
    def __init__(self, connection: Connection, options: _Options) -> None:
        self._options = options
        self._metadata = connection.metadata
        self._channel = connection.channel()
        self._stub = provider_pb2_grpc.ProviderStub(self._channel)

    def exchange(
        self, request: httpx.Request | httpx2.Request, body: bytes
    ) -> tuple[_Answer, Iterator[bytes] | None, Callable[[], None]]:
        """The answer; for an open stream also its remaining bytes and how
        to cancel it."""
        method, raw_path = request.method, request.url.raw_path
        headers = request.headers.multi_items()
        req = self._options.request(method, raw_path, headers, body)
        timeout = self._options.deadline(_read_timeout(request.extensions))
        try:
            if not wants_stream(headers, body):
                msg = self._stub.ProviderCall(
                    req, timeout=timeout, metadata=self._metadata
                )
                return _unary(msg), None, _nothing
            call = self._stub.ProviderStream(
                req, timeout=timeout, metadata=self._metadata
            )
            messages: Iterator[pb.ProviderStreamMessage] = iter(call)
            first = next(messages)
        except grpc.RpcError as exc:
            return _decided(exc), None, _nothing
        except StopIteration:
            raise _Failed("effectd: the stream ended at once") from None
        answer = _first(first)
        cancel: Callable[[], None] = call.cancel
        if answer.body is not None:
            cancel()
            return answer, None, _nothing
        return answer, _sync_chunks(first, messages), cancel

    def close(self) -> None:
        self._channel.close()


def _nothing() -> None:
    pass


def _sync_chunks(
    first: pb.ProviderStreamMessage, call: Iterator[pb.ProviderStreamMessage]
) -> Iterator[bytes]:
    msg = first
    while True:
        data, last = _tail(msg)
        if data:
            yield data
        if last:
            return
        try:
            msg = next(call)
        except StopIteration:
            raise _Broken("effectd: the stream ended without its end") from None
        except grpc.RpcError as exc:
            raise _Broken(str(_failure(exc))) from None


class _AsyncCore:
    def __init__(self, connection: Connection, options: _Options) -> None:
        self._connection = connection
        self._metadata = connection.metadata
        self._options = options
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> provider_pb2_grpc.ProviderAsyncStub:
        # Made on first use: an aio channel belongs to the running loop.
        if self._channel is None:
            self._channel = self._connection.aio_channel()
        return provider_pb2_grpc.ProviderStub(self._channel)

    async def exchange(
        self, request: httpx.Request | httpx2.Request, body: bytes
    ) -> tuple[_Answer, AsyncIterator[bytes] | None, Callable[[], None]]:
        method, raw_path = request.method, request.url.raw_path
        headers = request.headers.multi_items()
        req = self._options.request(method, raw_path, headers, body)
        timeout = self._options.deadline(_read_timeout(request.extensions))
        stub = self._stub()
        try:
            if not wants_stream(headers, body):
                msg = await stub.ProviderCall(
                    req, timeout=timeout, metadata=self._metadata
                )
                return _unary(msg), None, _nothing
            call = stub.ProviderStream(req, timeout=timeout, metadata=self._metadata)
            messages = aiter(call)
            first = await anext(messages, None)
        except grpc.RpcError as exc:
            return _decided(exc), None, _nothing
        if first is None:
            raise _Failed("effectd: the stream ended at once")
        answer = _first(first)

        def cancel() -> None:
            call.cancel()

        if answer.body is not None:
            cancel()
            return answer, None, _nothing
        return answer, _async_chunks(first, messages), cancel

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None


async def _async_chunks(
    first: pb.ProviderStreamMessage,
    messages: AsyncIterator[pb.ProviderStreamMessage],
) -> AsyncIterator[bytes]:
    msg = first
    while True:
        data, last = _tail(msg)
        if data:
            yield data
        if last:
            return
        try:
            nxt = await anext(messages, None)
        except grpc.RpcError as exc:
            raise _Broken(str(_failure(exc))) from None
        if nxt is None:
            raise _Broken("effectd: the stream ended without its end")
        msg = nxt


# -- httpx --------------------------------------------------------------------


class _HttpxStream(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes], cancel: Callable[[], None]) -> None:
        self._chunks = chunks
        self._cancel = cancel

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks
        except _BrokenAfter as exc:
            if exc.data:
                yield exc.data
            raise httpx.RemoteProtocolError(str(exc.broken)) from None
        except _Broken as exc:
            raise httpx.RemoteProtocolError(str(exc)) from None

    def close(self) -> None:
        self._cancel()


class _AsyncHttpxStream(httpx.AsyncByteStream):
    def __init__(
        self, chunks: AsyncIterator[bytes], cancel: Callable[[], None]
    ) -> None:
        self._chunks = chunks
        self._cancel = cancel

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                yield chunk
        except _BrokenAfter as exc:
            if exc.data:
                yield exc.data
            raise httpx.RemoteProtocolError(str(exc.broken)) from None
        except _Broken as exc:
            raise httpx.RemoteProtocolError(str(exc)) from None

    async def aclose(self) -> None:
        self._cancel()


def _httpx_error(exc: _Failed, request: httpx.Request) -> httpx.TransportError:
    error = httpx.ConnectError(str(exc), request=request)
    error.__cause__ = exc.__cause__
    return error


class EffectdTransport(httpx.BaseTransport):
    """An `httpx.Client` transport: each request is one ProviderCall or
    ProviderStream on `route` of the daemon at `target` (`unix:PATH` or
    `HOST:PORT`).

    `timeout`: an upper bound in seconds of each call's gRPC deadline, which
    is the request's own read timeout (None: the request's alone; neither:
    the daemon's default deadline). `max_retries`: lowers
    the route's retry cap. `drop_headers`: more request headers not to send
    (those the route injects itself, which the sidecar refuses). `token`,
    `tls`, `root_certificates`, `certificate_chain`, `private_key` and
    `max_message_bytes` reach the daemon as they do for `Client`.
    """

    def __init__(
        self,
        target: str,
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
        self._core = _SyncCore(
            connection(
                target,
                token=token,
                tls=tls,
                root_certificates=root_certificates,
                certificate_chain=certificate_chain,
                private_key=private_key,
                max_message_bytes=max_message_bytes,
            ),
            _options(route, timeout, max_retries, drop_headers),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        try:
            answer, chunks, cancel = self._core.exchange(request, body)
        except _Failed as exc:
            raise _httpx_error(exc, request) from exc.__cause__
        if chunks is None:
            return httpx.Response(
                answer.status, headers=answer.headers, content=answer.body
            )
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=_HttpxStream(chunks, cancel),
        )

    def close(self) -> None:
        self._core.close()


class AsyncEffectdTransport(httpx.AsyncBaseTransport):
    """`EffectdTransport` for an `httpx.AsyncClient` (grpc.aio); make and
    use it inside a running event loop."""

    def __init__(
        self,
        target: str,
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
        self._core = _AsyncCore(
            connection(
                target,
                token=token,
                tls=tls,
                root_certificates=root_certificates,
                certificate_chain=certificate_chain,
                private_key=private_key,
                max_message_bytes=max_message_bytes,
            ),
            _options(route, timeout, max_retries, drop_headers),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        try:
            answer, chunks, cancel = await self._core.exchange(request, body)
        except _Failed as exc:
            raise _httpx_error(exc, request) from exc.__cause__
        if chunks is None:
            return httpx.Response(
                answer.status, headers=answer.headers, content=answer.body
            )
        return httpx.Response(
            answer.status,
            headers=answer.headers,
            stream=_AsyncHttpxStream(chunks, cancel),
        )

    async def aclose(self) -> None:
        await self._core.close()


# -- httpx2 (imported on first use) -----------------------------------------


@functools.cache
def _httpx2_streams() -> tuple[
    type[httpx2.SyncByteStream], type[httpx2.AsyncByteStream]
]:
    import httpx2  # noqa: PLC0415 - optional

    class Stream(httpx2.SyncByteStream):
        def __init__(self, chunks: Iterator[bytes], cancel: Callable[[], None]) -> None:
            self._chunks = chunks
            self._cancel = cancel

        def __iter__(self) -> Iterator[bytes]:
            try:
                yield from self._chunks
            except _BrokenAfter as exc:
                if exc.data:
                    yield exc.data
                raise httpx2.RemoteProtocolError(str(exc.broken)) from None
            except _Broken as exc:
                raise httpx2.RemoteProtocolError(str(exc)) from None

        def close(self) -> None:
            self._cancel()

    class AsyncStream(httpx2.AsyncByteStream):
        def __init__(
            self, chunks: AsyncIterator[bytes], cancel: Callable[[], None]
        ) -> None:
            self._chunks = chunks
            self._cancel = cancel

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for chunk in self._chunks:
                    yield chunk
            except _BrokenAfter as exc:
                if exc.data:
                    yield exc.data
                raise httpx2.RemoteProtocolError(str(exc.broken)) from None
            except _Broken as exc:
                raise httpx2.RemoteProtocolError(str(exc)) from None

        async def aclose(self) -> None:
            self._cancel()

    return Stream, AsyncStream


def _httpx2_error(exc: _Failed, request: httpx2.Request) -> Exception:
    import httpx2  # noqa: PLC0415 - optional

    error = httpx2.ConnectError(str(exc), request=request)
    error.__cause__ = exc.__cause__
    return error


class Httpx2EffectdTransport(_Httpx2Base):
    """`EffectdTransport` for an `httpx2.Client`."""

    def __init__(
        self,
        target: str,
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
        self._core = _SyncCore(
            connection(
                target,
                token=token,
                tls=tls,
                root_certificates=root_certificates,
                certificate_chain=certificate_chain,
                private_key=private_key,
                max_message_bytes=max_message_bytes,
            ),
            _options(route, timeout, max_retries, drop_headers),
        )

    def __enter__(self) -> Httpx2EffectdTransport:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self.close()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        import httpx2  # noqa: PLC0415 - optional

        body = request.read()
        try:
            answer, chunks, cancel = self._core.exchange(request, body)
        except _Failed as exc:
            raise _httpx2_error(exc, request) from exc.__cause__
        if chunks is None:
            return httpx2.Response(
                answer.status, headers=answer.headers, content=answer.body
            )
        make: Callable[..., httpx2.SyncByteStream] = _httpx2_streams()[0]
        return httpx2.Response(
            answer.status, headers=answer.headers, stream=make(chunks, cancel)
        )

    def close(self) -> None:
        self._core.close()


class AsyncHttpx2EffectdTransport(_AsyncHttpx2Base):
    """`AsyncEffectdTransport` for an `httpx2.AsyncClient`."""

    def __init__(
        self,
        target: str,
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
        self._core = _AsyncCore(
            connection(
                target,
                token=token,
                tls=tls,
                root_certificates=root_certificates,
                certificate_chain=certificate_chain,
                private_key=private_key,
                max_message_bytes=max_message_bytes,
            ),
            _options(route, timeout, max_retries, drop_headers),
        )

    async def __aenter__(self) -> AsyncHttpx2EffectdTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        import httpx2  # noqa: PLC0415 - optional

        body = await request.aread()
        try:
            answer, chunks, cancel = await self._core.exchange(request, body)
        except _Failed as exc:
            raise _httpx2_error(exc, request) from exc.__cause__
        if chunks is None:
            return httpx2.Response(
                answer.status, headers=answer.headers, content=answer.body
            )
        make: Callable[..., httpx2.AsyncByteStream] = _httpx2_streams()[1]
        return httpx2.Response(
            answer.status, headers=answer.headers, stream=make(chunks, cancel)
        )

    async def aclose(self) -> None:
        await self._core.close()


__all__ = [
    "AsyncEffectdTransport",
    "AsyncHttpx2EffectdTransport",
    "EffectdTransport",
    "Httpx2EffectdTransport",
    "wants_stream",
]
