"""The checkpoint store through the real server (ADR-010 D1, contract §8):
revision compare-and-swap, no ABA, all-or-nothing Txn, ordered paginated
List, and isolation between namespaces."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from effectd.v1 import checkpoints_pb2 as cpb
from effectd.v1.checkpoints_pb2_grpc import CheckpointsStub

from tests.rpc.support import decode, expect_refusal
from tests.support.postgres import both_stores  # noqa: F401  (each store)

ABORTED = grpc.StatusCode.ABORTED
CONFLICT = "REVISION_CONFLICT"


def create(stub: CheckpointsStub, key: str, value: bytes, ns: str = "") -> int:
    request = cpb.PutCheckpointRequest(
        namespace=ns, key=key, value=value, expect_absent=True
    )
    revision: int = stub.Put(request, timeout=5).revision
    return revision


def update(stub: CheckpointsStub, key: str, value: bytes, revision: int) -> int:
    request = cpb.PutCheckpointRequest(key=key, value=value, expected_revision=revision)
    new: int = stub.Put(request, timeout=5).revision
    return new


def get(stub: CheckpointsStub, key: str, ns: str = "") -> cpb.Checkpoint:
    request = cpb.GetCheckpointRequest(namespace=ns, key=key)
    return stub.Get(request, timeout=5).checkpoint


def assert_absent(stub: CheckpointsStub, key: str, ns: str = "") -> None:
    expect_refusal(lambda: get(stub, key, ns), grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


def list_page(
    stub: CheckpointsStub,
    prefix: str = "",
    *,
    ns: str = "",
    page_size: int = 0,
    token: str = "",
    keys_only: bool = False,
) -> cpb.ListCheckpointsResponse:
    request = cpb.ListCheckpointsRequest(
        namespace=ns,
        prefix=prefix,
        page_size=page_size,
        page_token=token,
        keys_only=keys_only,
    )
    return stub.List(request, timeout=5)


def test_second_expect_absent_conflicts(checkpoints_stub: CheckpointsStub) -> None:
    """A put with expect_absent on an existing key is ABORTED REVISION_CONFLICT
    carrying the key's current revision, and the first value stands."""
    revision = create(checkpoints_stub, "k", b"first")
    got = expect_refusal(
        lambda: create(checkpoints_stub, "k", b"second"), ABORTED, CONFLICT
    )
    assert got.metadata["currentRevision"] == str(revision)
    assert got.metadata["key"] == "k"
    cp = get(checkpoints_stub, "k")
    assert (cp.value, cp.revision) == (b"first", revision)


def test_stale_expected_revision_conflicts(checkpoints_stub: CheckpointsStub) -> None:
    """A put stating an older revision is ABORTED with the current revision."""
    first = create(checkpoints_stub, "k", b"v1")
    second = update(checkpoints_stub, "k", b"v2", first)
    assert second > first
    got = expect_refusal(
        lambda: update(checkpoints_stub, "k", b"v3", first), ABORTED, CONFLICT
    )
    assert got.metadata["currentRevision"] == str(second)
    assert get(checkpoints_stub, "k").value == b"v2"


def test_expected_revision_on_absent_key_conflicts_with_zero(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """A put stating a revision of a key that does not exist is a conflict
    whose current revision is "0" (there is no unconditional create)."""
    got = expect_refusal(
        lambda: update(checkpoints_stub, "ghost", b"v", 1), ABORTED, CONFLICT
    )
    assert got.metadata["currentRevision"] == "0"
    assert_absent(checkpoints_stub, "ghost")


def test_concurrent_puts_on_one_revision_have_one_winner(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """Of 16 threads putting at the same expected revision at once, exactly
    one succeeds; the others are REVISION_CONFLICT and the winner's value
    is stored."""
    workers = 16
    base = create(checkpoints_stub, "race", b"base")
    barrier = threading.Barrier(workers)

    def attempt(i: int) -> tuple[int, int | None, str | None]:
        barrier.wait(timeout=10)
        try:
            return i, update(checkpoints_stub, "race", f"v{i}".encode(), base), None
        except grpc.RpcError as exc:
            got = decode(exc)
            assert got.code is ABORTED, got
            return i, None, got.reason

    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(attempt, range(workers)))
    winners = [(i, rev) for i, rev, _ in outcomes if rev is not None]
    assert len(winners) == 1, outcomes
    assert {reason for _, rev, reason in outcomes if rev is None} == {CONFLICT}
    winner, revision = winners[0]
    cp = get(checkpoints_stub, "race")
    assert (cp.value, cp.revision) == (f"v{winner}".encode(), revision)


def test_get_of_absent_key_is_not_found(checkpoints_stub: CheckpointsStub) -> None:
    """Get of a key that was never written answers NOT_FOUND / NOT_FOUND."""
    assert_absent(checkpoints_stub, "never-written")


def test_delete_needs_the_current_revision(checkpoints_stub: CheckpointsStub) -> None:
    """Delete with a wrong revision conflicts and keeps the key; with the
    current revision it removes the key."""
    first = create(checkpoints_stub, "k", b"v1")
    second = update(checkpoints_stub, "k", b"v2", first)

    def delete(revision: int) -> None:
        request = cpb.DeleteCheckpointRequest(key="k", expected_revision=revision)
        checkpoints_stub.Delete(request, timeout=5)

    got = expect_refusal(lambda: delete(first), ABORTED, CONFLICT)
    assert got.metadata["currentRevision"] == str(second)
    assert get(checkpoints_stub, "k").value == b"v2"
    delete(second)
    assert_absent(checkpoints_stub, "k")
    got = expect_refusal(lambda: delete(second), ABORTED, CONFLICT)
    assert got.metadata["currentRevision"] == "0"


def test_recreated_key_never_reuses_a_revision(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """After delete and re-create, the key has a new, higher revision and a
    writer holding the old revision is refused (no ABA)."""
    old = create(checkpoints_stub, "k", b"old")
    checkpoints_stub.Delete(
        cpb.DeleteCheckpointRequest(key="k", expected_revision=old), timeout=5
    )
    got = expect_refusal(
        lambda: update(checkpoints_stub, "k", b"stale", old), ABORTED, CONFLICT
    )
    assert got.metadata["currentRevision"] == "0"
    new = create(checkpoints_stub, "k", b"new")
    assert new > old
    got = expect_refusal(
        lambda: update(checkpoints_stub, "k", b"stale", old), ABORTED, CONFLICT
    )
    assert got.metadata["currentRevision"] == str(new)
    with pytest.raises(grpc.RpcError):
        checkpoints_stub.Delete(
            cpb.DeleteCheckpointRequest(key="k", expected_revision=old), timeout=5
        )
    assert get(checkpoints_stub, "k").value == b"new"


def test_revisions_come_from_one_counter(checkpoints_stub: CheckpointsStub) -> None:
    """Writes to different keys and namespaces get strictly increasing
    revisions from one store-wide counter."""
    revisions = [
        create(checkpoints_stub, "a", b"1"),
        create(checkpoints_stub, "b", b"1"),
        create(checkpoints_stub, "a", b"1", ns="other"),
    ]
    assert revisions == sorted(set(revisions))


def txn(
    stub: CheckpointsStub,
    compares: list[cpb.Compare],
    ops: list[cpb.TxnOp],
) -> int:
    request = cpb.CheckpointTxnRequest(compares=compares, ops=ops)
    revision: int = stub.Txn(request, timeout=5).revision
    return revision


def at(key: str, revision: int) -> cpb.Compare:
    return cpb.Compare(key=key, revision=revision)


def absent(key: str) -> cpb.Compare:
    return cpb.Compare(key=key, absent=True)


def put_op(key: str, value: bytes) -> cpb.TxnOp:
    return cpb.TxnOp(put=cpb.TxnPut(key=key, value=value))


def delete_op(key: str) -> cpb.TxnOp:
    return cpb.TxnOp(delete=cpb.TxnDelete(key=key))


def test_txn_with_one_failing_compare_writes_nothing(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """A Txn whose last compare fails answers REVISION_CONFLICT naming that
    key and leaves every key as it was."""
    ra = create(checkpoints_stub, "a", b"a0")
    rb = create(checkpoints_stub, "b", b"b0")
    rc = create(checkpoints_stub, "c", b"c0")
    got = expect_refusal(
        lambda: txn(
            checkpoints_stub,
            [at("a", ra), absent("new"), at("b", rb), at("c", rc + 100)],
            [
                put_op("a", b"a1"),
                put_op("new", b"n1"),
                delete_op("b"),
                put_op("c", b"c1"),
            ],
        ),
        ABORTED,
        CONFLICT,
    )
    assert got.metadata["key"] == "c"
    assert got.metadata["currentRevision"] == str(rc)
    for key, value, revision in (("a", b"a0", ra), ("b", b"b0", rb), ("c", b"c0", rc)):
        cp = get(checkpoints_stub, key)
        assert (cp.value, cp.revision) == (value, revision)
    assert_absent(checkpoints_stub, "new")
    # a is still at the revision it had before the refused Txn.
    assert update(checkpoints_stub, "a", b"a2", ra) > rc


def test_txn_applies_puts_and_deletes_with_one_revision(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """A Txn whose compares hold applies every put and delete, and every put
    carries the one revision the answer names."""
    ra = create(checkpoints_stub, "a", b"a0")
    rb = create(checkpoints_stub, "b", b"b0")
    untouched = create(checkpoints_stub, "guard", b"g")
    revision = txn(
        checkpoints_stub,
        [at("a", ra), at("b", rb), absent("c"), at("guard", untouched)],
        [put_op("a", b"a1"), delete_op("b"), put_op("c", b"c1")],
    )
    assert revision > untouched
    assert (get(checkpoints_stub, "a").value, get(checkpoints_stub, "a").revision) == (
        b"a1",
        revision,
    )
    assert (get(checkpoints_stub, "c").value, get(checkpoints_stub, "c").revision) == (
        b"c1",
        revision,
    )
    assert_absent(checkpoints_stub, "b")
    assert get(checkpoints_stub, "guard").revision == untouched


def test_list_by_prefix_in_key_order_with_pages(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """List with page_size 2 over 5 keys of a prefix gives pages of 2, 2 and
    1 keys in key order, skipping keys outside the prefix; the last page has
    no token."""
    for key in ("p/3", "p/1", "q/0", "p/5", "o/9", "p/2", "p/4", "p"):
        create(checkpoints_stub, key, f"value of {key}".encode())
    pages: list[list[str]] = []
    token = ""
    while True:
        page = list_page(checkpoints_stub, "p/", page_size=2, token=token)
        pages.append([cp.key for cp in page.checkpoints])
        for cp in page.checkpoints:
            assert cp.value == f"value of {cp.key}".encode()
            assert cp.revision > 0
        token = page.next_page_token
        if not token:
            break
    assert pages == [["p/1", "p/2"], ["p/3", "p/4"], ["p/5"]]


def test_list_keys_only_leaves_values_out(checkpoints_stub: CheckpointsStub) -> None:
    """keys_only answers keys and revisions without values."""
    revisions = {k: create(checkpoints_stub, k, b"payload") for k in ("x/a", "x/b")}
    page = list_page(checkpoints_stub, "x/", keys_only=True)
    assert [(cp.key, cp.value, cp.revision) for cp in page.checkpoints] == [
        ("x/a", b"", revisions["x/a"]),
        ("x/b", b"", revisions["x/b"]),
    ]
    assert [cp.value for cp in list_page(checkpoints_stub, "x/").checkpoints] == [
        b"payload",
        b"payload",
    ]


def test_namespaces_are_isolated(checkpoints_stub: CheckpointsStub) -> None:
    """A key put in namespace a is NOT_FOUND in b, not listed there, and the
    same key can be created in b independently."""
    ra = create(checkpoints_stub, "shared", b"from a", ns="a")
    assert_absent(checkpoints_stub, "shared", ns="b")
    assert_absent(checkpoints_stub, "shared")
    assert list(list_page(checkpoints_stub, ns="b").checkpoints) == []
    rb = create(checkpoints_stub, "shared", b"from b", ns="b")
    assert rb != ra
    assert get(checkpoints_stub, "shared", ns="a").value == b"from a"
    assert get(checkpoints_stub, "shared", ns="b").value == b"from b"
    # A write in b with a's revision is refused: revisions do not cross over.
    got = expect_refusal(
        lambda: checkpoints_stub.Put(
            cpb.PutCheckpointRequest(
                namespace="b", key="shared", value=b"x", expected_revision=ra
            ),
            timeout=5,
        ),
        ABORTED,
        CONFLICT,
    )
    assert got.metadata["currentRevision"] == str(rb)


def test_page_token_of_another_namespace_reveals_nothing(
    checkpoints_stub: CheckpointsStub,
) -> None:
    """A page token from a listing of namespace a, used in namespace b, is
    refused or lists only b's keys: never a key of a."""
    for i in range(4):
        create(checkpoints_stub, f"k{i}", b"secret", ns="a")
    create(checkpoints_stub, "k9", b"public", ns="b")
    token = list_page(checkpoints_stub, ns="a", page_size=1).next_page_token
    assert token
    try:
        page = list_page(checkpoints_stub, ns="b", page_size=10, token=token)
    except grpc.RpcError as exc:
        got = decode(exc)
        assert got.code is grpc.StatusCode.INVALID_ARGUMENT, got
        return
    assert [(cp.key, cp.value) for cp in page.checkpoints] == [("k9", b"public")]
