"""The checkpoint service: applies the rules of `sidecar.ledger.checkpoints`
(ADR-010 D1, contract §8) in write transactions. A Txn checks all its compares
before it writes anything, inside one write function, so it applies all or
nothing; Put and Delete are one-key Txns.

A Txn that would grow the namespace over its `stored_bytes` quota is refused
whole (`ledger.quota`); one that shrinks it or deletes is always applied, so a
namespace over its quota can always free space.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import InvalidArgument, NotFound
from sidecar.ledger import paging, quota
from sidecar.ledger.checkpoints import Expect, Op, StoredCheckpoint, check
from sidecar.ledger.quota import Quotas
from sidecar.services._common import committed
from sidecar.storage import keys
from sidecar.storage.api import LedgerReads, LedgerWrites, Store
from sidecar.storage.scans import Scans


@dataclass(frozen=True, slots=True)
class CheckpointPage:
    checkpoints: list[StoredCheckpoint]
    next_page_token: str


class CheckpointService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        quotas: Quotas | None = None,
        scans: Scans | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._quotas = quotas or Quotas()
        # Listings read many rows: off the event loop; point reads too, on a
        # store whose reads may wait.
        self._scans = scans or Scans(store)

    async def get(self, namespace: str, key: str) -> StoredCheckpoint:
        found = await self._scans.point_read(
            lambda view: view.load_checkpoint(namespace, key)
        )
        if found is None:
            raise NotFound(
                f"no checkpoint {key!r} in namespace {namespace}", {"key": key}
            )
        return found

    async def txn(
        self, namespace: str, compares: Sequence[Expect], ops: Sequence[Op]
    ) -> int:
        """Checks every compare, then applies every op; returns the revision
        given to the puts. Put, Delete and Txn all go through here."""

        limited = self._quotas.limits_storage

        def apply(view: LedgerWrites) -> int:
            before = view.usage(namespace) if limited else None
            for expect in compares:
                current = view.load_checkpoint(namespace, expect.key)
                check(expect, None if current is None else current.revision)
            revision = view.next_checkpoint_revision()
            now = self._clock.wall_ns()
            for op in ops:
                if op.value is None:
                    view.delete_checkpoint(namespace, op.key)
                else:
                    cp = StoredCheckpoint(op.key, op.value, revision, now)
                    view.save_checkpoint(namespace, cp)
            if before is None:
                return revision
            after = view.usage(namespace)
            refusal = quota.refuse_growth(namespace, before, after, self._quotas)
            if refusal is not None:
                # Raised inside the write function: none of the ops is kept.
                raise refusal
            return revision

        return await committed(self._store, apply)

    async def put(self, namespace: str, expect: Expect, value: bytes) -> int:
        return await self.txn(namespace, [expect], [Op(expect.key, value)])

    async def delete(self, namespace: str, key: str, revision: int) -> None:
        await self.txn(namespace, [Expect(key, revision)], [Op(key, None)])

    async def list(
        self, namespace: str, *, prefix: str, page_size: int, page_token: str
    ) -> CheckpointPage:
        """Checkpoints whose key starts with `prefix`, in stored-key order (key
        order, but for keys stored hashed: `storage.keys`). Like
        ListToolCalls, a page may be short: the rows read per page are
        bounded, and long keys that only share the prefix's first bytes are
        read and skipped."""
        after = _resume(page_token, namespace, prefix)
        budget = max(page_size * 10, 1000)

        def scan(view: LedgerReads) -> CheckpointPage:
            found: list[StoredCheckpoint] = []
            last = b""
            for examined, (stored, cp) in enumerate(
                view.checkpoints(namespace, prefix, after=after)
            ):
                if len(found) == page_size or examined == budget:
                    return CheckpointPage(found, paging.encode(last))
                last = stored
                if cp.key.startswith(prefix):
                    found.append(cp)
            return CheckpointPage(found, "")

        return await self._scans.read(scan)


def _resume(token: str, namespace: str, prefix: str) -> bytes | None:
    """The stored key a page token continues after. A token is a stored key
    inside the listing's ranges; one from a daemon before store format 3 is
    the last readable key (it has no NUL, a stored key always has one)."""
    ranges = keys.checkpoint_ranges(namespace, prefix)
    try:
        return paging.decode_within(token, ranges)
    except InvalidArgument:
        key = paging.decode_text(token, prefix)
        if key is None or "\x00" in key:
            raise
        return keys.checkpoint_key(namespace, key)
