"""The daemon side of the fuzz test: one real daemon (on LMDB or on a
PostgreSQL store of its own, the manual clock, a provider route to a local
upstream) with records seeded in every state, every RPC of every service
found from the descriptors, raw request bytes sent on a generic channel, and
each answer checked.

Checked for every request: the answer is never UNKNOWN or INTERNAL (nor a
plain DEADLINE_EXCEEDED: a hang); a refusal of an effectd service carries
ErrorInfo (domain `effectd`) whose reason is a value of the `ErrorReason`
enum and whose code is the one the error table gives that reason; bad input
is INVALID_REQUEST with its field violations; and a refused request writes
nothing: the count of rows the store committed is unchanged (LMDB's own
count; on PostgreSQL, one kept by triggers on the store's tables,
`tests.support.pg_writes`, which counts every row any transaction committed,
whoever wrote it). Only the transport's RESOURCE_EXHAUSTED for a message
over its limit carries no ErrorInfo. The session stream is sent its messages
one at a time, each answer checked the same way.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import queue
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import effectd.v1
import grpc
from effectd.v1 import admin_pb2 as apb
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import errors_pb2
from effectd.v1 import ledger_pb2 as pb
from google.protobuf.descriptor import MethodDescriptor
from grpc_health.v1 import health_pb2

from sidecar import errors
from sidecar.clock import ManualClock
from sidecar.config import ServeConfig, ServerLimits
from sidecar.rpc.errors import CODES
from sidecar.seams import Seams
from sidecar.server import Daemon
from sidecar.storage.api import Store
from sidecar.storage.lmdb.store import LmdbStore
from sidecar.testing import RunningDaemon, running_daemon
from tests.provider.support import FakeSleep
from tests.provider.upstream import Reply, serving
from tests.rpc.support import Refusal, decode, decode_status, prepare_request, ref
from tests.support import pg_writes

NS, RUN = "fz", "run"
SESSION = "/effectd.v1.ToolLedger/Session"
BACKUP = "/effectd.v1.Admin/Backup"
NEVER = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})
MAX_MESSAGE = ServerLimits().max_message_bytes
# A session message with a shorter deadline of its own may be cut by it.
SHORT_TIMEOUT_MS = 5_000
# The parent of a backup path that the fuzz may name: it does not exist.
MISSING_PARENT = "/nonexistent-effectd-fuzz"

# The values that pass validation and name a seeded record, by field name
# (or full name); GENERIC for every other string field.
POOLS: dict[str, tuple[str, ...]] = {
    "namespace": ("", NS, "default"),
    "run_id": (RUN, "r2"),
    "call_id": ("prepared", "started", "unknown", "awaiting", "committed", "c1"),
    "call_ids": ("committed", "prepared", "c1"),
    "tool_name": ("t", "tool"),
    "key": ("k", "k2", "k/1"),
    "prefix": ("", "k"),
    "json": ("{}", "1", '{"a": [1, 2.5, "x"]}', '"s"', "null"),
    "raw": ("r", ""),
    "route": ("up", "nope"),
    "effectd.v1.ProviderRequest.path": (
        "/v1/chat",
        "/v1/x?q=1",
        "/v1/../x",
        "http://elsewhere/v1/",
        "/v1/%2e%2e/x",
        "/v1/%zz",
    ),
    "method": ("POST", "GET", "DELETE", "BREW", "GE T"),
    "name": ("x-a", "Authorization", "Host", "Content-Length", "Idempotency-Key"),
    "value": ("1", "abc", "a\r\nX-Injected: 1", ""),
    # Output only: a plausible request leaves it empty.
    "digest": ("",),
    "traceparent": ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",),
    "GENERIC": ("", NS, RUN, "prepared", "k", "t", "ops", "lost", "sha256:00"),
}


def _modules() -> list[Any]:
    return [
        importlib.import_module(f"effectd.v1.{m.name}")
        for m in pkgutil.iter_modules(effectd.v1.__path__)
        if m.name.endswith("_pb2")
    ]


def methods() -> dict[str, MethodDescriptor]:
    """Every RPC of every effectd service and of gRPC health, by path."""
    files = [m.DESCRIPTOR for m in _modules()] + [health_pb2.DESCRIPTOR]
    return {
        f"/{s.full_name}/{m.name}": m
        for file in files
        for s in file.services_by_name.values()
        for m in s.methods
    }


def reason_codes() -> dict[str, frozenset[grpc.StatusCode]]:
    """Each ErrorInfo reason of the domain errors, with the codes the error
    table gives it."""
    found: dict[str, set[grpc.StatusCode]] = {}
    pending: list[type[errors.EffectdError]] = [errors.EffectdError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        code = next((CODES[c] for c in cls.__mro__ if c in CODES), None)
        if code is not None:
            found.setdefault(cls.reason, set()).add(code)
    return {reason: frozenset(codes) for reason, codes in found.items()}


REASONS = frozenset(errors_pb2.ErrorReason.DESCRIPTOR.values_by_name) - {
    "ERROR_REASON_UNSPECIFIED"
}


@dataclass(slots=True)
class Figures:
    """What a fuzz run did: requests sent, by kind and by answer."""

    executions: int = 0
    by_method: dict[str, int] = field(default_factory=dict)
    by_answer: dict[str, int] = field(default_factory=dict)
    skipped: int = 0

    def count(self, path: str, answer: str) -> None:
        self.executions += 1
        self.by_method[path] = self.by_method.get(path, 0) + 1
        self.by_answer[answer] = self.by_answer.get(answer, 0) + 1


class InFlight:
    """The writes handed to a store's writer threads (`Store.submit`) and
    not resolved yet. A session message cut by its own short deadline may
    have handed its write over: the write commits (or not) after the answer,
    and must not be counted as the next request's."""

    # A write the store has not resolved by then is a hang.
    SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[futures.Future[Any]] = set()

    def track(self, store: Store) -> None:
        submit = store.submit

        def tracked(fn: Callable[[Any], Any]) -> futures.Future[Any]:
            future = submit(fn)
            with self._lock:
                self._pending.add(future)
            future.add_done_callback(self._resolved)
            return future

        store.submit = tracked  # type: ignore[method-assign]

    def _resolved(self, future: futures.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def wait_resolved(self) -> None:
        """Waits until every write handed over so far is resolved."""
        with self._lock:
            pending = list(self._pending)
        _, unresolved = futures.wait(pending, timeout=self.SECONDS)
        assert not unresolved, f"{len(unresolved)} store writes never resolved"


class KeepingDaemon(Daemon):
    """Keeps the store it opens, so the test can count its writes, and
    tracks the writes it hands to the store's writer threads."""

    store: Store

    def open_store(self) -> Store:
        self.store = super().open_store()
        self.in_flight = InFlight()
        self.in_flight.track(self.store)
        return self.store


class Target:
    """One fuzzed daemon and the checks of its answers; `store` names its
    store ("lmdb" or "postgres")."""

    def __init__(
        self,
        running: RunningDaemon,
        channel: grpc.Channel,
        root: Path,
        rows_written: Callable[[], int],
        store: str,
    ):
        self.running = running
        self.store = store
        self.channel = channel
        self.root = root
        self._rows_written = rows_written
        daemon = running.daemon
        assert isinstance(daemon, KeepingDaemon)
        self._in_flight = daemon.in_flight
        self.codes = reason_codes()
        self.figures = Figures()

    def writes(self) -> int:
        """The rows the store has committed, once every write handed to it
        is resolved."""
        self._in_flight.wait_resolved()
        return self._rows_written()

    # -- sending -------------------------------------------------------------

    def send(self, path: str, method: MethodDescriptor, data: bytes) -> list[str]:
        """Sends raw request bytes to one RPC; the problems found."""
        if path == BACKUP and not self.backup_is_safe(data):
            self.figures.skipped += 1
            return []
        before = self.writes()
        streaming = (method.client_streaming, method.server_streaming)
        try:
            if streaming == (False, False):
                self.channel.unary_unary(path, None, None)(data, timeout=30)
            elif streaming == (False, True):
                stream: Any = self.channel.unary_stream(path, None, None)(
                    data, timeout=30
                )
                if path.startswith("/grpc.health"):  # Watch never ends
                    next(stream, None)
                    stream.cancel()
                else:
                    for _ in stream:
                        pass
            else:
                raise AssertionError(f"{path}: send sessions with `session`")
        except grpc.RpcError as exc:
            got = decode(exc)
            if got.code is grpc.StatusCode.CANCELLED and path.startswith(
                "/grpc.health"
            ):
                self.figures.count(path, "OK")
                return []
            self.figures.count(path, got.code.name)
            return self.check(path, got, len(data), before)
        self.figures.count(path, "OK")
        return []

    def session(self, messages: list[bytes]) -> list[str]:
        """Sends session messages one at a time, each answer awaited (a
        cancel is not answered; a message that does not parse ends the
        stream); the problems found."""
        outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

        def requests() -> Iterator[bytes]:
            while (item := outbox.get()) is not None:
                yield item

        answers: Any = self.channel.stream_stream(SESSION, None, None)(
            requests(), timeout=60
        )
        found: list[str] = []
        try:
            for data in messages:
                sent = _parsed(data)
                before = self.writes()
                outbox.put(data)
                if sent is not None and sent.WhichOneof("request") == "cancel":
                    self.figures.count(SESSION, "cancel")
                    continue
                got_bytes = next(answers, None)
                if got_bytes is None:
                    found.append("the stream ended without answering a message")
                    break
                if sent is None:
                    found.append("a message that does not parse was answered")
                    break
                answer = pb.SessionResponse.FromString(got_bytes)
                if answer.id != sent.id:
                    found.append(f"answered id {answer.id} for {sent.id}")
                if answer.WhichOneof("response") != "error":
                    self.figures.count(SESSION, "OK")
                    continue
                got = decode_status(answer.error)
                self.figures.count(SESSION, got.code.name)
                if (
                    got.code is grpc.StatusCode.DEADLINE_EXCEEDED
                    and 0 < sent.timeout_ms < SHORT_TIMEOUT_MS
                ):
                    continue  # its own short deadline; it may have written
                found += self.check(SESSION, got, len(data), before)
            outbox.put(None)
            for extra in answers:
                found.append(f"an answer after the last message: {extra!r}")
        except grpc.RpcError as exc:
            got = decode(exc)
            self.figures.count(SESSION, f"stream-{got.code.name}")
            found += self.check(SESSION, got, 0, self.writes())
        finally:
            outbox.put(None)
            answers.cancel()
        return found

    # -- checking ------------------------------------------------------------

    def check(self, path: str, got: Refusal, size: int, before: int) -> list[str]:
        """The problems of one refusal: its code, its ErrorInfo, its writes."""
        found = []
        if got.code in NEVER or got.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            found.append(f"{got.code.name}: {got.message}")
        elif path.startswith("/effectd."):
            found += self._details(got, size)
        written = self.writes() - before
        if written:
            found.append(f"refused {got.code.name} {got.reason} but wrote {written}")
        return found

    def _details(self, got: Refusal, size: int) -> list[str]:
        if size > MAX_MESSAGE and got.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return []  # the transport's own refusal: no details
        if got.domain != "effectd" or got.reason is None:
            return [f"{got.code.name} without effectd ErrorInfo: {got.message}"]
        if got.reason not in REASONS:
            return [f"reason {got.reason} is not an ErrorReason"]
        if got.code not in self.codes.get(got.reason, ()):
            return [f"reason {got.reason} answered {got.code.name}"]
        if got.reason == "INVALID_REQUEST" and not got.fields:
            return ["INVALID_REQUEST without field violations"]
        return []

    def backup_is_safe(self, data: bytes) -> bool:
        """Whether a backup request would write only below the test's own
        directory (or nowhere): the fuzz must never copy the store elsewhere."""
        try:
            path = apb.BackupRequest.FromString(data).path
        except Exception:
            return True
        if not path.startswith("/"):
            return True
        resolved = os.path.normpath(path)
        return resolved.startswith(str(self.root) + "/") or resolved.startswith(
            MISSING_PARENT + "/"
        )


def _parsed(data: bytes) -> pb.SessionRequest | None:
    try:
        return pb.SessionRequest.FromString(data)
    except Exception:
        return None


def _seed(channel: grpc.Channel) -> None:
    """A record in each state of the pool's identities, and a checkpoint."""

    def call(method: str, request: Any) -> bytes:
        answer: bytes = channel.unary_unary(f"/effectd.v1.{method}", None, None)(
            request.SerializeToString(), timeout=30
        )
        return answer

    def prepared(call_id: str, **kw: Any) -> None:
        request = prepare_request(RUN, call_id, namespace=NS, **kw)
        call("ToolLedger/PrepareTool", request)

    result = pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="{}"))
    prepared("prepared")
    prepared("started", start=True, lease_ms=3_600_000)
    prepared("unknown", start=True)
    call(
        "ToolLedger/ReportUnknown",
        pb.ReportUnknownRequest(ref=ref(RUN, "unknown", NS), attempt=1),
    )
    prepared("awaiting", require_approval=True)
    prepared("committed", start=True)
    call(
        "ToolLedger/CommitTool",
        pb.CommitToolRequest(ref=ref(RUN, "committed", NS), attempt=1, result=result),
    )
    call(
        "Checkpoints/Put",
        cpb.PutCheckpointRequest(namespace=NS, key="k", value=b"v", expect_absent=True),
    )


@contextmanager
def fuzzed_daemon(
    daemon_class: type[KeepingDaemon] = KeepingDaemon, store: str | None = None
) -> Iterator[Target]:
    """A daemon for a fuzz run, seeded, with a provider route `up` to a local
    upstream that answers 200 to everything; on LMDB, or on the PostgreSQL
    store at `store` (a migrated schema the run owns)."""
    with ExitStack() as stack:
        root = Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="effectd-fz-"))
        )
        upstream = stack.enter_context(serving(Reply()))
        providers = root / "providers.toml"
        (root / "key").write_text("sk-fuzz")
        providers.write_text(
            f'[routes.up]\nbase_url = "{upstream.base_url}"\n'
            f'credential_file = "{root / "key"}"\npaths = ["/v1/"]\n'
        )
        rows_written: Callable[[], int] | None = None
        if store is not None:
            rows_written = stack.enter_context(pg_writes.counted(store))
        config = ServeConfig(
            data_dir=root / "data",
            store=store,
            sync=False,
            providers_file=providers,
            settle_interval_seconds=1e9,
            retention_interval_seconds=1e9,
        )
        clock = ManualClock()
        # Backoff never waits, and never moves the clock (no lease lapses).
        seams = Seams(clock=clock, backoff_sleep=FakeSleep(clock, advance=False))
        daemon = daemon_class(config, seams)
        running = stack.enter_context(running_daemon(config, daemon=daemon))
        channel = stack.enter_context(
            grpc.insecure_channel(
                running.target,
                options=[
                    ("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20),
                ],
            )
        )
        if rows_written is None:
            lmdb = daemon.store
            assert isinstance(lmdb, LmdbStore)
            rows_written = lambda: lmdb.stats.writes  # noqa: E731
        _seed(channel)
        # The count sees the seeding's writes: it cannot pass by counting
        # nothing.
        assert rows_written() > 0, "the count of rows written missed the seeding"
        kind = "lmdb" if store is None else "postgres"
        yield Target(running, channel, root, rows_written, kind)


def with_sandbox_pools(root: Path) -> dict[str, tuple[str, ...]]:
    """The pools, with the backup paths of this run's directory."""
    return {
        **POOLS,
        "effectd.v1.BackupRequest.path": (
            str(root / "backup-a"),
            str(root / "backup-b"),
            str(root),
            "relative/backup",
            MISSING_PARENT + "/b",
            "",
        ),
    }
