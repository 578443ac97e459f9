"""The daemon side of the torture test: a real daemon on the manual clock,
reached over gRPC with the generated stubs, restarted on the same store, and
its answers and records reduced to the plain values the model gives.

A `Backend` says how a daemon's store is made: LMDB in a temporary
directory, or a schema of PostgreSQL; the state machine is the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import grpc
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import (
    checkpoints_pb2_grpc,
    ledger_pb2_grpc,
    recovery_pb2_grpc,
    retry_pb2_grpc,
)
from effectd.v1 import ledger_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from tests.support import postgres
from tests.torture.model import Err, Input, Ok, Result

T = TypeVar("T")
# The periodic passes never run on their own: the test runs them as steps.
NEVER = 1e9


class Backend(Protocol):
    """How the daemons of one test get their store."""

    @property
    def name(self) -> str: ...

    def config(self, workdir: Path) -> ServeConfig:
        """The configuration of a daemon over this test's store; the same
        store for every call with the same `workdir` (restarts)."""
        ...


@dataclass(frozen=True, slots=True)
class LmdbBackend:
    name: str = "lmdb"

    def config(self, workdir: Path) -> ServeConfig:
        return ServeConfig(
            data_dir=workdir / "data",
            settle_interval_seconds=NEVER,
            retention_interval_seconds=NEVER,
        )


class PostgresBackend:
    """The shared store: one schema per daemon data directory, made by the
    migrations, in a database the test owns (`tests.support.postgres`)."""

    name = "postgres"

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._schemas: dict[Path, str] = {}
        self._stack = ExitStack()

    def config(self, workdir: Path) -> ServeConfig:
        if workdir not in self._schemas:
            self._schemas[workdir] = self._stack.enter_context(
                postgres.schema(self.database_url)
            )
        return dataclasses.replace(
            LmdbBackend().config(workdir), store=self._schemas[workdir]
        )

    def close(self) -> None:
        self._stack.close()


def ts_ns(stamp: Timestamp) -> int:
    return stamp.seconds * 1_000_000_000 + stamp.nanos


def refusal(error: grpc.RpcError) -> Err:
    """The gRPC code and ErrorInfo reason of a refusal; an `index` in the
    metadata (batches, acknowledgements) is appended as "@index", a
    `currentRevision` of a checkpoint conflict as ":revision"."""
    call = cast(grpc.Call, error)
    status = rpc_status.from_call(call)
    reason = "?"
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
                if "index" in info.metadata:
                    reason += "@" + info.metadata["index"]
                if "currentRevision" in info.metadata:
                    reason += ":" + info.metadata["currentRevision"]
    return Err(call.code().name, reason)


def payload(given: Input | None) -> pb.Payload | None:
    if given is None:
        return None
    if given.kind == "json":
        return pb.Payload(json=given.text)
    return pb.Payload(raw=given.text.encode())


def result_message(result: Result) -> pb.ToolResult:
    return pb.ToolResult(
        outcome=pb.Outcome.Value("OUTCOME_" + result.outcome),
        payload=payload(result.payload),
        error_code=result.error_code,
        error_message=result.error_message,
    )


def payload_view(given: pb.Payload) -> tuple[str, str] | None:
    kind = given.WhichOneof("kind")
    if kind == "json":
        return ("json", given.json)
    if kind == "raw":
        return ("raw", given.raw.decode())
    return None


class Fingerprints:
    """The daemon's fingerprints, matched one to one with the model's input
    classes: the same class always has one fingerprint, two classes never
    share one."""

    def __init__(self) -> None:
        self.of_class: dict[str, str] = {}

    def class_of(self, fingerprint: str, expected: str) -> str:
        known = self.of_class.setdefault(expected, fingerprint)
        if known != fingerprint:
            return f"<{fingerprint} is not {expected}'s {known}>"
        owners = [c for c, f in self.of_class.items() if f == fingerprint]
        if owners != [expected]:
            return f"<{fingerprint} shared by {owners}>"
        return expected


def enum_name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix)


def call_view(
    call: pb.ToolCall, fingerprints: Fingerprints, expected_class: str
) -> dict[str, Any]:
    """A record as plain values, in the shape of `model_view`."""
    result = None
    if call.HasField("result"):
        result = (
            enum_name(pb.Outcome, call.result.outcome, "OUTCOME_"),
            payload_view(call.result.payload),
            call.result.error_code,
            call.result.error_message,
        )
    approval = None
    if call.HasField("approval"):
        approval = (
            call.approval.approved,
            call.approval.approver,
            call.approval.revision,
            fingerprints.class_of(call.approval.input_fingerprint, expected_class),
        )
    state = enum_name(pb.CallState, call.state, "CALL_STATE_")
    return {
        "ref": (call.ref.namespace, call.ref.run_id, call.ref.call_id),
        "tool": call.tool_name,
        "effect": enum_name(pb.Effect, call.effect, "EFFECT_"),
        "channel": enum_name(pb.CallChannel, call.channel, "CALL_CHANNEL_"),
        "state": state,
        "revision": call.revision,
        "attempt": call.attempt,
        "key": call.idempotency_key,
        "key_scheme": call.key_scheme,
        "fingerprint": fingerprints.class_of(call.input_fingerprint, expected_class),
        "approval_required": call.approval_required,
        "lease_expires_at": ts_ns(call.lease_expires_at) if state == "STARTED" else 0,
        "unknown_since": ts_ns(call.unknown_since),
        "result": result,
        "acknowledged": call.acknowledged,
        "created_at": ts_ns(call.created_at),
        "updated_at": ts_ns(call.updated_at),
        "history": [
            (
                enum_name(pb.CallState, t.from_state, "CALL_STATE_"),
                enum_name(pb.CallState, t.to_state, "CALL_STATE_"),
                t.event,
                t.revision,
                t.attempt,
                ts_ns(t.at),
            )
            for t in call.history
        ],
        "approval": approval,
        "reconciliations": [
            (
                enum_name(pb.Resolution, r.resolution, "RESOLUTION_"),
                enum_name(pb.CallState, r.from_state, "CALL_STATE_"),
                r.revision,
                r.attempt,
            )
            for r in call.reconciliations
        ],
        "kept_input": payload_view(call.kept_input),
    }


class Daemon:
    """One test's daemon: started, restarted on the same store, stopped."""

    def __init__(self, backend: Backend, workdir: Path) -> None:
        self.clock = ManualClock()
        self.config = backend.config(workdir)
        self._stack = ExitStack()
        self.running: RunningDaemon | None = None
        self.channel: grpc.Channel | None = None
        self.ids = itertools.count(1)
        self.up()

    def up(self) -> None:
        self._stack = ExitStack()
        self.running = self._stack.enter_context(
            running_daemon(self.config, self.clock)
        )
        self.channel = self._stack.enter_context(
            grpc.insecure_channel(self.running.target)
        )
        self.ledger = ledger_pb2_grpc.ToolLedgerStub(self.channel)
        self.recovery = recovery_pb2_grpc.RecoveryStub(self.channel)
        self.retry = retry_pb2_grpc.RetryPolicyStub(self.channel)
        self.checkpoints = checkpoints_pb2_grpc.CheckpointsStub(self.channel)

    def down(self) -> None:
        self._stack.close()
        self.running = None

    def restart(self) -> None:
        self.down()
        self.up()

    def run(self, coro: Any) -> Any:
        assert self.running is not None
        return asyncio.run_coroutine_threadsafe(coro, self.running.loop).result(
            timeout=30
        )

    def compact(self) -> None:
        assert self.running is not None
        self.run(self.running.daemon.compact_expired())

    def sweep(self) -> None:
        assert self.running is not None
        self.run(self.running.daemon.sweep_leases())

    def renew(self) -> None:
        """Renews the registration now, as the periodic renewal that a clock
        advance wakes will, but before the next request: the model's daemon
        always vouches for its leases in time."""
        assert self.running is not None
        self.run(self.running.daemon.renew())


def call(fn: Callable[..., T], request: Any) -> T | Err:
    """One RPC: its answer, or its refusal as the model spells it."""
    try:
        return fn(request, timeout=30)
    except grpc.RpcError as error:
        return refusal(error)


def daemons(backend: Backend, workdir: Path) -> Iterator[Daemon]:
    daemon = Daemon(backend, workdir)
    try:
        yield daemon
    finally:
        daemon.down()


__all__ = ["Ok", "cpb", "pb"]
