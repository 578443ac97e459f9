"""What the sync and async ledger sessions share, free of I/O: the messages,
the table of messages in flight, and the errors a session raises.

A session carries the requests of PrepareTool, PrepareTools, StartTool,
CommitTool, ReportUnknown, Heartbeat and GetToolCall over one
`ToolLedger.Session` stream. Its errors are `SessionRpcError`s, a
`grpc.RpcError` with the code, details and `grpc-status-details-bin`
trailer of the unary call, so `EffectdError.from_rpc_error` reads a refusal
the same whichever way it came:

  the daemon's answer `error` (google.rpc.Status) -> that status, as sent
  the caller's wait passed                         -> DEADLINE_EXCEEDED (a
                                                      `cancel` is sent)
  the stream broke after the message was sent      -> UNAVAILABLE,
                                                      mayHaveBeenApplied=true
  the stream broke before it, twice, or found no   -> UNAVAILABLE,
    connection to the daemon                          mayHaveBeenApplied=false
  the client was closed                            -> CANCELLED
  the stream was refused as a whole                -> see `ended`

A message the stream broke before sending is sent again once on a new
stream: it cannot have been applied. A stream that found no connection
(`never_connected`: gRPC never sent it) sent none of its messages, whatever
gRPC had taken from the queue; they fail at once as not sent, and the client
waits for the daemon (`effectd_client._reconnect`). A daemon that answers
the stream UNIMPLEMENTED (one older than the session) is asked by the unary
RPCs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from effectd.v1 import ledger_pb2 as pb
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from effectd_client._exceptions import EffectdError

#: The unary RPC of each message kind, and the field of its request and
#: answer in SessionRequest / SessionResponse.
FIELDS: dict[str, str] = {
    "PrepareTool": "prepare_tool",
    "PrepareTools": "prepare_tools",
    "StartTool": "start_tool",
    "CommitTool": "commit_tool",
    "ReportUnknown": "report_unknown",
    "Heartbeat": "heartbeat",
    "GetToolCall": "get_tool_call",
}

METHOD = "/effectd.v1.ToolLedger/Session"
# The key and value of the ErrorInfo metadata of a message whose stream broke.
MAY_HAVE_BEEN_APPLIED = "mayHaveBeenApplied"
_DETAILS_KEY = "grpc-status-details-bin"
_DOMAIN = "effectd"
_MAX_TIMEOUT_MS = 2**32 - 1
# Sends of one message on a new stream after its stream broke before it.
RESENDS = 1
#: A session's answer to a message it does not carry now (the daemon does
#: not serve the session, or has no room for it): the message is asked by
#: its unary RPC.
UNARY = object()

W = TypeVar("W")


class SessionRpcError(grpc.RpcError):
    """A message's failure, read as a unary call's (`code()`, `details()`,
    `trailing_metadata()` with the status details)."""

    def __init__(self, status: status_pb2.Status) -> None:
        super().__init__(status.message)
        self._status = status

    def code(self) -> grpc.StatusCode:
        return _CODES.get(self._status.code, grpc.StatusCode.UNKNOWN)

    def details(self) -> str:
        return str(self._status.message)

    def trailing_metadata(self) -> Any:
        """The status details as the unary call's trailer carries them."""
        if not self._status.details:
            return ()
        return ((_DETAILS_KEY, self._status.SerializeToString()),)

    def __str__(self) -> str:
        return f"{self.code().name}: {self.details()}"


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def failure(
    code: grpc.StatusCode, message: str, metadata: dict[str, str] | None = None
) -> SessionRpcError:
    """A failure made by the client, with ErrorInfo `metadata` when given."""
    status = status_pb2.Status(code=code.value[0], message=message)
    if metadata:
        info = error_details_pb2.ErrorInfo(domain=_DOMAIN, metadata=metadata)
        status.details.add().Pack(info)
    return SessionRpcError(status)


def broken(applied: bool, why: str) -> SessionRpcError:
    """The stream broke with the message in flight: UNAVAILABLE, and whether
    the daemon may have applied it (then the outcome is unknown)."""
    said = "may have been applied" if applied else "was not sent"
    return failure(
        grpc.StatusCode.UNAVAILABLE,
        f"the session stream broke ({why}); the request {said}",
        {MAY_HAVE_BEEN_APPLIED: "true" if applied else "false"},
    )


def deadline_exceeded() -> SessionRpcError:
    return failure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def closed() -> SessionRpcError:
    return failure(grpc.StatusCode.CANCELLED, "the client was closed")


def _code(error: BaseException | None) -> grpc.StatusCode | None:
    """The status of a failed call (sync or aio), None for anything else."""
    if not isinstance(error, grpc.RpcError):
        return None
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def why(error: BaseException | None) -> str:
    """A broken stream's cause, for the message of its messages' failures."""
    code = _code(error)
    if code is not None:
        return f"{code.name}: {getattr(error, 'details', lambda: '')()}"
    return "it ended" if error is None else repr(error)


def never_connected(error: BaseException | None) -> bool:
    """The call (unary or stream) failed before gRPC had a connection for it:
    nothing of it reached the daemon.

    gRPC fails a call so when its channel cannot connect (its load balancer's
    pick fails); a call it had sent ends otherwise ("Stream removed",
    "Socket closed"), and one it never put on the wire, or that the daemon
    refused unread (GOAWAY), gRPC itself sends again on a new connection
    before it fails it with this status.
    """
    if _code(error) is not grpc.StatusCode.UNAVAILABLE:
        return False
    return NO_CONNECTION in getattr(error, "details", lambda: "")()


#: How gRPC (core) says that a call found no connection: the pick_first
#: balancer's message, as of grpcio 1.5x (the pinned version's test fails
#: if it changes: `tests/clients/test_reconnect.py`).
NO_CONNECTION = "failed to connect to all addresses"


def refused(error: BaseException | None) -> bool:
    """The daemon turned the stream down as a whole, before serving any of
    its messages: it does not serve the stream, or not to this credential,
    or it had no room for it. A RESOURCE_EXHAUSTED that names none of the
    daemon's limits is gRPC's own (an answer over the client's message size
    limit): it may end a stream whose messages were applied, so it is a
    broken stream, not a refusal."""
    code = _code(error)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert isinstance(error, grpc.RpcError)
        return EffectdError.from_rpc_error(error).reason in _NO_ROOM
    return code in _REFUSALS


def stopped(error: BaseException | None) -> bool:
    """The daemon ended the stream because it is stopping (SHUTTING_DOWN):
    it does so only once every message it read is answered (docs/contract.md
    §2.8, §12), so a message without an answer then was not read."""
    if _code(error) is not grpc.StatusCode.UNAVAILABLE:
        return False
    assert isinstance(error, grpc.RpcError)
    return EffectdError.from_rpc_error(error).reason == "SHUTTING_DOWN"


# UNIMPLEMENTED: a daemon older than the stream. PERMISSION_DENIED: a
# credential that may call none of its RPCs, or a daemon whose authorization
# predates the stream. UNAUTHENTICATED: the token, refused as on any RPC.
# RESOURCE_EXHAUSTED: the daemon's pool of streams is full (for this caller).
_REFUSALS = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
# How the daemon's admission refuses a stream it has no room for.
_NO_ROOM = frozenset({"CONCURRENCY_LIMITED", "RATE_LIMITED"})
#: Seconds of unary calls after the daemon had no room for a stream, when
#: its refusal does not say (RetryInfo).
FULL_PAUSE = 1.0


def timeout_ms(timeout: float | None) -> int:
    """The message's deadline: the call's timeout, rounded up (0: none)."""
    if timeout is None:
        return 0
    return max(1, min(_MAX_TIMEOUT_MS, math.ceil(timeout * 1000)))


def request(name: str, message_id: int, body: Message, timeout: float | None) -> Any:
    """The SessionRequest carrying `body`, the request of RPC `name`."""
    msg = pb.SessionRequest(id=message_id, timeout_ms=timeout_ms(timeout))
    getattr(msg, FIELDS[name]).CopyFrom(body)
    return msg


def cancel(message_id: int) -> Any:
    return pb.SessionRequest(id=message_id, cancel=pb.SessionCancel())


def outcome(name: str, answer: Any) -> Any:
    """The unary answer carried by `answer`, or its error (raised)."""
    kind = answer.WhichOneof("response")
    if kind == "error":
        raise SessionRpcError(answer.error)
    if kind != FIELDS[name]:
        raise failure(
            grpc.StatusCode.INTERNAL,
            f"the daemon answered {name} with {kind or 'nothing'}",
        )
    return getattr(answer, kind)


@dataclass(slots=True, eq=False)
class Entry(Generic[W]):
    """A message in flight: the RPC it stands for, who waits for its answer,
    the stream it is queued on and whether that stream took it."""

    name: str
    message: Any
    waiter: W
    stream: object = None
    sent: bool = False
    resends: int = 0


class InFlight(Generic[W]):
    """The messages sent or queued and not answered, by id.

    Not thread-safe: the sync session holds its lock around every use.
    """

    def __init__(self) -> None:
        self._ids: Iterator[int] = itertools.count(1)
        self._entries: dict[int, Entry[W]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self, name: str, body: Message, timeout: float | None, waiter: W
    ) -> Entry[W]:
        message_id = next(self._ids)
        entry = Entry(name, request(name, message_id, body, timeout), waiter)
        self._entries[message_id] = entry
        return entry

    def pending(self, entry: Entry[W]) -> bool:
        return self._entries.get(entry.message.id) is entry

    def drop(self, entry: Entry[W]) -> bool:
        """Forgets `entry` (its caller stopped waiting); whether it was there."""
        return self._entries.pop(entry.message.id, None) is entry

    def answer(self, message_id: int) -> Entry[W] | None:
        """The entry `message_id` answers, forgotten; None for an unknown id
        (one whose caller stopped waiting)."""
        return self._entries.pop(message_id, None)

    def broken(self, stream: object) -> tuple[list[Entry[W]], list[Entry[W]]]:
        """The stream broke: the messages that fail (forgotten: those it
        took, and those sent again `RESENDS` times already) and those to send
        again on a new stream (kept)."""
        failed, again = [], []
        for entry in self.take(stream):
            if entry.sent or entry.resends >= RESENDS:
                failed.append(entry)
            else:
                entry.resends += 1
                entry.stream = None
                self._entries[entry.message.id] = entry
                again.append(entry)
        return failed, again

    def take(self, stream: object) -> list[Entry[W]]:
        """The messages queued on or taken by `stream`, forgotten."""
        taken = [e for e in self._entries.values() if e.stream is stream]
        for entry in taken:
            del self._entries[entry.message.id]
        return taken

    def clear(self) -> list[Entry[W]]:
        entries = list(self._entries.values())
        self._entries.clear()
        return entries


@dataclass(slots=True)
class Ending(Generic[W]):
    """What the end of a stream means for the messages it carried."""

    #: The daemon does not serve the stream: ask the unary RPCs from now on.
    unary: bool
    #: Messages that fail, each with its error.
    failed: list[tuple[Entry[W], Exception]]
    #: Messages to ask by their unary RPC (none of them was served).
    fallback: list[Entry[W]]
    #: Messages the stream did not take: to send on a new stream.
    again: list[Entry[W]]
    #: Seconds to ask by unary calls before a new stream is tried (0: none).
    pause: float = 0.0


def ended(
    table: InFlight[W], stream: object, error: BaseException | None, closing: bool
) -> Ending[W]:
    """The end of `stream` (`error`: why; `closing`: the client is closing).

    A stream refused as a whole served none of its messages: those of a
    stream the daemon does not serve (to this credential) are asked by their
    unary RPCs, for the client's life, which answer each as the daemon would
    (PERMISSION_DENIED, if so); an unknown token fails them as it would any
    call (UNAUTHENTICATED), and the next call opens a new stream; a daemon
    without room for another stream (CONCURRENCY_LIMITED) has them asked by
    unary calls, as every call for a pause (its RetryInfo, else
    `FULL_PAUSE`), since a unary call holds a slot only while it is served.
    A stream that found no connection fails its messages as not sent, for
    the client to wait for the daemon (`effectd_client._reconnect`); so does
    one the daemon ended as it stopped (SHUTTING_DOWN, sent once every
    message it read is answered) with its messages taken, those not taken
    being sent once more as on any break.
    """
    if closing:
        return Ending(
            False,
            [
                (e, broken(True, why(error)) if e.sent else closed())
                for e in table.take(stream)
            ],
            [],
            [],
        )
    if refused(error):
        assert isinstance(error, Exception)
        code = _code(error)
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return Ending(False, [(e, error) for e in table.take(stream)], [], [])
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            delay = EffectdError.from_rpc_error(error).retry_delay  # type: ignore[arg-type]
            pause = FULL_PAUSE if delay is None else delay
            return Ending(False, [], table.take(stream), [], pause=pause)
        return Ending(True, [], table.take(stream), [])
    if never_connected(error):
        # It took none of its messages, whatever gRPC had read from the
        # queue; a new stream at once would find no connection either.
        unsent: list[tuple[Entry[W], Exception]] = [
            (e, broken(False, why(error))) for e in table.take(stream)
        ]
        return Ending(False, unsent, [], [])
    failed, again = table.broken(stream)
    # The daemon ends a stream as it stops once every message it read is
    # answered: one taken and unanswered then was never read, not sent.
    taken = not stopped(error)
    return Ending(
        False, [(e, broken(e.sent and taken, why(error))) for e in failed], [], again
    )
