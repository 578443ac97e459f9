"""Readers that hold an old snapshot of the LMDB store (issue 15 item 6): a
long read transaction does not stop writes, it sees its snapshot to the end,
and the pages it pinned are reused once it ends; a reader process killed
while it held a transaction leaves a stale slot in LMDB's reader table,
which must not pin its snapshot for ever (the map would fill with dead
pages, and every write be refused STORAGE_FULL until a restart).

The control of each is the growth itself: while the reader holds its
snapshot, the same overwrites do grow the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1.checkpoints_pb2_grpc import CheckpointsStub

from sidecar.config import ServeConfig
from sidecar.storage.lmdb.store import LmdbStore
from sidecar.testing import RunningDaemon, running_daemon
from tests.torture.fuzzing import KeepingDaemon

MiB = 1 << 20
VALUE_BYTES = 16 << 10
NS = "readers"


@pytest.fixture
def kept(short_tmp: Path) -> Iterator[tuple[RunningDaemon, LmdbStore]]:
    config = ServeConfig(data_dir=short_tmp / "data", map_size=2 * MiB, sync=False)
    daemon = KeepingDaemon(config, None)
    with running_daemon(config, daemon=daemon) as running:
        assert isinstance(daemon.store, LmdbStore)
        yield running, daemon.store


def overwrite(stub: CheckpointsStub, revision: int, times: int, byte: int) -> int:
    """Overwrites checkpoint "k" `times` times; its last revision."""
    for _ in range(times):
        revision = stub.Put(
            cpb.PutCheckpointRequest(
                namespace=NS,
                key="k",
                value=bytes([byte]) * VALUE_BYTES,
                expected_revision=revision,
            ),
            timeout=30,
        ).revision
    return revision


def first_put(stub: CheckpointsStub) -> int:
    return int(
        stub.Put(
            cpb.PutCheckpointRequest(
                namespace=NS, key="k", value=b"\x00" * VALUE_BYTES, expect_absent=True
            ),
            timeout=30,
        ).revision
    )


def high_water(store: LmdbStore) -> int:
    return store.fill().high_water_bytes


def test_a_long_reader_does_not_stop_writes_and_its_pages_return(
    kept: tuple[RunningDaemon, LmdbStore],
) -> None:
    """A read transaction held through 40 overwrites: every write is taken,
    the reader still sees the value of its snapshot, the store grows; once
    it ends, 40 more overwrites grow it by less than half as much (its pages
    are reused)."""
    running, store = kept
    with grpc.insecure_channel(running.target) as channel:
        stub = CheckpointsStub(channel)
        revision = first_put(stub)
        revision = overwrite(stub, revision, 5, 1)
        before = high_water(store)
        reader = store._env.begin(write=False)
        try:
            seen = reader.cursor(store._dbs[next(iter(store._dbs))]).first()
            revision = overwrite(stub, revision, 40, 2)
            held = high_water(store) - before
            assert reader.id() < store._env.info()["last_txnid"]
            assert isinstance(seen, bool)
        finally:
            reader.abort()
        after = high_water(store)
        overwrite(stub, revision, 40, 3)
        released = high_water(store) - after
    assert held > 0
    assert released < held / 2, (held, released)


READER = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=True, max_dbs=16, subdir=True)
txn = env.begin()
print("holding", flush=True)
time.sleep(600)
"""


def test_a_killed_reader_does_not_pin_its_snapshot_for_ever(
    kept: tuple[RunningDaemon, LmdbStore],
) -> None:
    """A process opens the store, begins a read transaction and is killed
    (SIGKILL) holding it: its slot in the reader table is stale. Overwrites
    of one checkpoint, many times what the 2 MiB map holds, are all taken
    (fails before the fix: STORAGE_FULL once the dead snapshot's pages
    filled the map)."""
    running, store = kept
    with grpc.insecure_channel(running.target) as channel:
        stub = CheckpointsStub(channel)
        revision = first_put(stub)
        with subprocess.Popen(
            [sys.executable, "-c", READER, str(store.path)],
            stdout=subprocess.PIPE,
            text=True,
        ) as reader:
            try:
                assert reader.stdout is not None
                assert reader.stdout.readline().strip() == "holding"
            finally:
                os.kill(reader.pid, signal.SIGKILL)
                reader.wait(timeout=30)
        # 400 x 16 KiB: three times the map, were no page ever reused.
        overwrite(stub, revision, 400, 4)
    assert high_water(store) <= 2 * MiB
