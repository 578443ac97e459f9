"""The Provider service's side of the httpx transports, sans I/O.

Which requests stream (`wants_stream`), the `ProviderRequest` of an HTTP
request (`Options`), the HTTP answer of a `ProviderResponse` or of a
stream's first message, the bytes of a stream's messages, and the sidecar's
decisions without an upstream answer as HTTP answers (`decided`). What
cannot be answered is a `Failure`, which each transport raises as its HTTP
library's error. `is_hop_by_hop` holds the one list of the headers a
transport never sends and the daemon refuses.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc
from effectd.v1 import provider_pb2 as pb

from effectd_client._exceptions import EffectdError

# The one list, the daemon's too (through `is_hop_by_hop`).
_HOP_BY_HOP = frozenset(
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
    }
)
# Never sent: the sidecar refuses them, or sets them itself (credentials: the
# route's own, added by the sidecar).
NOT_SENT = _HOP_BY_HOP | {
    "host",
    "content-length",
    "authorization",
    "x-api-key",
    "api-key",
}
# Not answered: the body is answered whole and decoded.
NOT_ANSWERED = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "x-should-retry"}
)

# The sidecar's decisions about a request it sent, or may have sent, upstream
# without an HTTP answer to show: answered as HTTP with `x-should-retry:
# false`, never raised. The SDKs (openai, anthropic) retry every exception a
# transport raises, whatever that header says, so a raised error would send
# the request upstream again after the sidecar decided not to.
DECIDED = {
    "UPSTREAM_UNAVAILABLE": 502,
    "RETRY_BUDGET_EXHAUSTED": 503,
    "UPSTREAM_DEADLINE_EXCEEDED": 504,
    # The call's deadline passed before the daemon answered: it covers every
    # attempt the sidecar made.
    "DEADLINE_EXCEEDED": 504,
}


def is_hop_by_hop(name: str) -> bool:
    """Whether `name` is a hop-by-hop header (RFC 9110 §7.6.1, and the proxy
    ones). It belongs to one connection: the transports never send it, and
    the sidecar refuses it in a provider request and drops it from answers.
    """
    return name.lower() in _HOP_BY_HOP


class Failure(Exception):
    """A failure each HTTP library reports as its own error (the transports'
    `_mapped`)."""


class Failed(Failure):
    """The daemon took no decision about the upstream (it could not be
    reached, or refused the request): a connect error."""


class Broken(Failure):
    """A stream ended by a failure after its commit point: a protocol error."""


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


def read_timeout(extensions: Mapping[str, object]) -> float | None:
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
class Options:
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
                if n.lower() not in NOT_SENT
                and n.lower() not in self.drop
                and not n.lower().startswith("proxy-")
            ],
            body=body,
        )
        if self.max_retries is not None:
            msg.max_retries = self.max_retries
        return msg


def options(
    route: str,
    timeout: float | None,
    max_retries: int | None,
    drop_headers: Iterable[str],
) -> Options:
    return Options(
        route=route,
        timeout=timeout,
        max_retries=max_retries,
        drop=frozenset(h.lower() for h in drop_headers),
    )


def answer_headers(
    headers: Sequence[pb.Header], attempts: int | None
) -> list[tuple[str, str]]:
    """The answer's headers; the attempt count is known unless a stream is
    still open."""
    out = [(h.name, h.value) for h in headers if h.name.lower() not in NOT_ANSWERED]
    out.append(("x-should-retry", "false"))
    if attempts is not None:
        out.append(("x-effectd-attempts", str(attempts)))
    return out


def sse(events: Sequence[pb.SseEvent]) -> bytes:
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


def failure(exc: grpc.RpcError) -> Failed:
    err = EffectdError.from_rpc_error(exc)
    failed = Failed(f"effectd: {err}")
    failed.__cause__ = err
    return failed


def decided(exc: grpc.RpcError) -> Answer:
    """The answer of a call the sidecar ended without an upstream answer;
    raises `Failed` when the daemon decided nothing about the upstream."""
    err = EffectdError.from_rpc_error(exc)
    reason = err.reason or err.code.name
    status = DECIDED.get(reason)
    if status is None:
        raise failure(exc)
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
    return Answer(status, headers, body)


def broken_end(end: pb.StreamEnd) -> Broken | None:
    if not (end.committed and end.error):
        return None
    return Broken(
        f"effectd: the upstream stream failed after {end.events_delivered} "
        f"events ({end.error}; {pb.StopReason.Name(end.stop_reason)}); "
        "a committed stream is never retried or replayed"
    )


@dataclass(slots=True)
class Answer:
    """What every flavour turns into its response."""

    status: int
    headers: list[tuple[str, str]]
    # Whole: the body. Streamed: None, and `chunks` yields it.
    body: bytes | None


def unary(msg: pb.ProviderResponse) -> Answer:
    return Answer(msg.status, answer_headers(msg.headers, len(msg.attempts)), msg.body)


def opening(msg: pb.ProviderStreamMessage) -> Answer:
    """The answer of a stream's first message; its body when the stream
    ended in it (a non-2xx answer, an error event)."""
    if not msg.HasField("head"):
        raise Failed("effectd: the stream began without its head")
    attempts = len(msg.end.attempts) if msg.HasField("end") else None
    answer = Answer(msg.head.status, answer_headers(msg.head.headers, attempts), None)
    if msg.HasField("end") and broken_end(msg.end) is None:
        answer.body = sse(msg.events) + msg.end.body
    return answer


def tail(msg: pb.ProviderStreamMessage) -> tuple[bytes, Broken | None, bool]:
    """The bytes of one message, the failure it ends with, and whether it
    was the last."""
    data = sse(msg.events)
    if not msg.HasField("end"):
        return data, None, False
    broken = broken_end(msg.end)
    if broken is not None:
        return data, broken, True
    return data + msg.end.body, None, True


def sync_chunks(
    first: pb.ProviderStreamMessage, call: Iterator[pb.ProviderStreamMessage]
) -> Iterator[bytes]:
    msg = first
    while True:
        data, broken, last = tail(msg)
        if data:
            yield data
        if broken is not None:
            raise broken
        if last:
            return
        try:
            msg = next(call)
        except StopIteration:
            raise Broken("effectd: the stream ended without its end") from None
        except grpc.RpcError as exc:
            raise Broken(str(failure(exc))) from None


async def async_chunks(
    first: pb.ProviderStreamMessage,
    messages: AsyncIterator[pb.ProviderStreamMessage],
) -> AsyncIterator[bytes]:
    msg = first
    while True:
        data, broken, last = tail(msg)
        if data:
            yield data
        if broken is not None:
            raise broken
        if last:
            return
        try:
            nxt = await anext(messages, None)
        except grpc.RpcError as exc:
            raise Broken(str(failure(exc))) from None
        if nxt is None:
            raise Broken("effectd: the stream ended without its end")
        msg = nxt


def nothing() -> None:
    pass


__all__ = [
    "DECIDED",
    "Answer",
    "Broken",
    "Failed",
    "Failure",
    "Options",
    "async_chunks",
    "broken_end",
    "decided",
    "failure",
    "is_hop_by_hop",
    "nothing",
    "opening",
    "options",
    "read_timeout",
    "sync_chunks",
    "unary",
    "wants_stream",
]
