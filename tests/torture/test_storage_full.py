"""A full store (issue 15 item 6): the LMDB map full (a 1 MiB map) and the
disk full (a 1 MiB tmpfs under a large map). Writes are refused
RESOURCE_EXHAUSTED / STORAGE_FULL and the refused write is not there; every
write answered before is there with its exact bytes; reads, the ledger's
included, go on; writes resume once space returns (checkpoints deleted, a
larger map, a larger filesystem), and after a restart everything answered is
still there.

The disk-full test mounts a tmpfs: it needs root and `mount`, and fails
(never skips) where they are missing. The negative control acknowledges a
write the full map refused, and the checks must find it lost.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1 import ledger_pb2 as pb
from effectd.v1.checkpoints_pb2_grpc import CheckpointsStub
from effectd.v1.ledger_pb2_grpc import ToolLedgerStub

from sidecar.clock import ManualClock
from sidecar.config import ServeConfig
from sidecar.storage.lmdb import answers
from sidecar.storage.lmdb.store import LmdbStore
from sidecar.testing import RunningDaemon, running_daemon
from tests.rpc.support import Refusal, assert_serving, decode, prepare_request

NS = "full"
VALUE_BYTES = 32 << 10
# A 1 MiB map or filesystem holds fewer than this many 32 KiB values.
MOST_WRITES = 200
MiB = 1 << 20

Acked = dict[str, tuple[bytes, int]]


def put(stub: CheckpointsStub, key: str, value: bytes) -> int:
    answer = stub.Put(
        cpb.PutCheckpointRequest(
            namespace=NS, key=key, value=value, expect_absent=True
        ),
        timeout=30,
    )
    return int(answer.revision)


def fill(stub: CheckpointsStub, acked: Acked, prefix: str) -> tuple[str, Refusal]:
    """Puts new 32 KiB checkpoints until one is refused; the refused key and
    its refusal. `acked` gets every write answered."""
    for i in range(MOST_WRITES):
        key = f"{prefix}{i}"
        value = os.urandom(VALUE_BYTES)
        try:
            acked[key] = (value, put(stub, key, value))
        except grpc.RpcError as exc:
            return key, decode(exc)
    raise AssertionError(f"{MOST_WRITES} writes of {VALUE_BYTES} bytes all fitted")


def lost(stub: CheckpointsStub, acked: Acked) -> list[str]:
    """The answered writes that are not there with their bytes and revision."""
    missing = []
    for key, (value, revision) in acked.items():
        try:
            got = stub.Get(
                cpb.GetCheckpointRequest(namespace=NS, key=key), timeout=30
            ).checkpoint
        except grpc.RpcError as exc:
            missing.append(f"{key}: {exc.code().name}")
            continue
        if (got.value, got.revision) != (value, revision):
            missing.append(f"{key}: revision {got.revision}, not {revision}")
    return missing


def absent(stub: CheckpointsStub, key: str) -> bool:
    try:
        stub.Get(cpb.GetCheckpointRequest(namespace=NS, key=key), timeout=30)
    except grpc.RpcError as exc:
        return bool(exc.code() is grpc.StatusCode.NOT_FOUND)
    return False


def assert_refused_full(refusal: Refusal) -> None:
    assert (refusal.code, refusal.reason) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "STORAGE_FULL",
    ), refusal


def assert_reads_go_on(channel: grpc.Channel, acked: Acked) -> None:
    """Every answered write is there, a ledger record is read, the daemon
    serves."""
    assert lost(CheckpointsStub(channel), acked) == []
    ledger = ToolLedgerStub(channel)
    got = ledger.GetToolCall(
        pb.GetToolCallRequest(ref=pb.CallRef(namespace=NS, run_id="run", call_id="c")),
        timeout=30,
    )
    assert got.call.state == pb.CALL_STATE_PREPARED
    assert_serving(channel)


@contextmanager
def serving(config: ServeConfig) -> Iterator[tuple[RunningDaemon, grpc.Channel]]:
    with (
        running_daemon(config, ManualClock()) as running,
        grpc.insecure_channel(running.target) as channel,
    ):
        yield running, channel


def seed_call(channel: grpc.Channel) -> None:
    ToolLedgerStub(channel).PrepareTool(
        prepare_request("run", "c", namespace=NS), timeout=30
    )


def test_a_full_map_refuses_writes_keeps_reads_and_resumes(short_tmp: Path) -> None:
    """A 1 MiB map: a write that does not fit is STORAGE_FULL and not there;
    every answered write is; a ledger write is refused too; deleting
    checkpoints makes room again; a larger map after a restart takes the
    refused write, and nothing answered is lost."""
    config = ServeConfig(data_dir=short_tmp / "data", map_size=MiB, sync=True)
    acked: Acked = {}
    with serving(config) as (_, channel):
        seed_call(channel)
        stub = CheckpointsStub(channel)
        refused_key, refusal = fill(stub, acked, "a")
        assert_refused_full(refusal)
        assert absent(stub, refused_key)
        assert_reads_go_on(channel, acked)
        # Room again: two values deleted make room for one.
        for key in sorted(acked)[:2]:
            stub.Delete(
                cpb.DeleteCheckpointRequest(
                    namespace=NS, key=key, expected_revision=acked.pop(key)[1]
                ),
                timeout=30,
            )
        value = os.urandom(VALUE_BYTES)
        acked[refused_key] = (value, put(stub, refused_key, value))
        assert_reads_go_on(channel, acked)
    bigger = dataclasses.replace(config, map_size=16 * MiB)
    with serving(bigger) as (_, channel):
        assert_reads_go_on(channel, acked)
        value = os.urandom(VALUE_BYTES)
        acked["after"] = (value, put(CheckpointsStub(channel), "after", value))
        assert_reads_go_on(channel, acked)


def test_negative_control_an_acknowledged_write_the_map_refused_is_found(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that answers a write the full map refused as if it had
    committed: the checks find the answered write lost."""

    def ack_anyway(self: LmdbStore, batch: list[Any], exc: Exception) -> None:
        answers.resolve([(waiter, 1 << 40, None) for _, waiter in batch])

    monkeypatch.setattr(LmdbStore, "_commit_too_big", ack_anyway)
    config = ServeConfig(data_dir=short_tmp / "data", map_size=MiB)
    acked: Acked = {}
    with serving(config) as (_, channel):
        stub = CheckpointsStub(channel)
        for i in range(MOST_WRITES // 2):
            value = os.urandom(VALUE_BYTES)
            acked[f"k{i}"] = (value, put(stub, f"k{i}", value))
        assert lost(stub, acked) != []


@contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on a new directory (0700); fails the test
    when it cannot be mounted (root and `mount` are required)."""
    with tempfile.TemporaryDirectory(prefix="effectd-full-", dir="/tmp") as tmp:
        where = Path(tmp) / "fs"
        where.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", where],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            pytest.fail(
                "the disk-full test mounts a tmpfs and needs root and mount: "
                f"{mounted.stderr.strip()}"
            )
        try:
            yield where
        finally:
            subprocess.run(["umount", "-l", where], check=True)


def remount(where: Path, size: str) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,size={size}", where], check=True, capture_output=True
    )


def test_a_full_disk_refuses_writes_keeps_reads_and_resumes() -> None:
    """LMDB on a 1 MiB filesystem under a 64 MiB map: the write the disk
    cannot take is STORAGE_FULL and not there; every answered write is;
    the filesystem made larger, writes resume without a restart; after a
    restart nothing answered is lost."""
    with tmpfs("1m") as fs:
        config = ServeConfig(
            data_dir=fs / "data",
            socket=fs.parent / "effectd.sock",
            map_size=64 * MiB,
        )
        acked: Acked = {}
        with serving(config) as (_, channel):
            seed_call(channel)
            stub = CheckpointsStub(channel)
            refused_key, refusal = fill(stub, acked, "a")
            assert_refused_full(refusal)
            assert absent(stub, refused_key)
            assert_reads_go_on(channel, acked)
            # Still full: refused again, the same way.
            again = os.urandom(VALUE_BYTES)
            with pytest.raises(grpc.RpcError) as raised:
                put(stub, refused_key, again)
            assert_refused_full(decode(raised.value))
            remount(fs, "8m")
            acked[refused_key] = (again, put(stub, refused_key, again))
            assert_reads_go_on(channel, acked)
        with serving(config) as (_, channel):
            assert_reads_go_on(channel, acked)
