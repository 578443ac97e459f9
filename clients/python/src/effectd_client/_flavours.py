"""What the httpx transports need of their HTTP library, and the one place
their failures become its errors.

A `Flavour` is one library (`httpx`, or `httpx2` imported on first use):
the response it answers with, the body streams it reads, and the error it
raises for each internal `Failure`. `mapped` is the failure boundary, as
httpx's own `map_httpcore_exceptions` is: around an exchange with the
daemon and around the iteration of a stream's body.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from effectd_client import _provider as wire

if TYPE_CHECKING:
    import httpx2

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Flavour(Generic[R]):
    """One HTTP library: its response, the body streams it reads, and the
    error it raises for each internal failure."""

    response: Callable[..., R]
    sync_stream: Callable[
        [Flavour[Any], object, Iterator[bytes], Callable[[], None]], object
    ]
    async_stream: Callable[
        [Flavour[Any], object, AsyncIterator[bytes], Callable[[], None]], object
    ]
    errors: Mapping[type[wire.Failure], Callable[..., Exception]]

    def respond(self, answer: wire.Answer, stream: object | None) -> R:
        if stream is None:
            return self.response(
                answer.status, headers=answer.headers, content=answer.body
            )
        return self.response(answer.status, headers=answer.headers, stream=stream)


@contextlib.contextmanager
def mapped(flavour: Flavour[Any], request: object) -> Iterator[None]:
    """Raises an internal failure as the flavour's own error, at this one
    boundary (httpx's `map_httpcore_exceptions`)."""
    try:
        yield
    except wire.Failure as exc:
        error = flavour.errors[type(exc)]
        raise error(str(exc), request=request) from exc.__cause__


@dataclass(eq=False)
class Body:
    """The body of a stream still open; closing it cancels the call."""

    flavour: Flavour[Any]
    request: object
    chunks: Iterator[bytes]
    cancel: Callable[[], None]

    def __iter__(self) -> Iterator[bytes]:
        with mapped(self.flavour, self.request):
            yield from self.chunks

    def close(self) -> None:
        self.cancel()


@dataclass(eq=False)
class AsyncBody:
    """`Body` of an asyncio stream."""

    flavour: Flavour[Any]
    request: object
    chunks: AsyncIterator[bytes]
    cancel: Callable[[], None]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with mapped(self.flavour, self.request):
            async for chunk in self.chunks:
                yield chunk

    async def aclose(self) -> None:
        self.cancel()


class _HttpxBody(Body, httpx.SyncByteStream):
    pass


class _AsyncHttpxBody(AsyncBody, httpx.AsyncByteStream):
    pass


HTTPX = Flavour(
    httpx.Response,
    _HttpxBody,
    _AsyncHttpxBody,
    {wire.Failed: httpx.ConnectError, wire.Broken: httpx.RemoteProtocolError},
)


@functools.cache
def httpx2_flavour() -> Flavour[httpx2.Response]:
    import httpx2  # noqa: PLC0415 - optional, imported on first use

    class Httpx2Body(Body, httpx2.SyncByteStream):
        pass

    class AsyncHttpx2Body(AsyncBody, httpx2.AsyncByteStream):
        pass

    errors = {wire.Failed: httpx2.ConnectError, wire.Broken: httpx2.RemoteProtocolError}
    return Flavour(httpx2.Response, Httpx2Body, AsyncHttpx2Body, errors)


__all__ = ["HTTPX", "AsyncBody", "Body", "Flavour", "httpx2_flavour", "mapped"]
