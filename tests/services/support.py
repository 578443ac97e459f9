"""A ledger over a real store for service tests, and a store seam that lets a
policy reload land between a request's arrival and its write."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from sidecar.ledger.fingerprint import fingerprint
from sidecar.ledger.model import CallRef, Effect, Payload, PayloadKind
from sidecar.ledger.policy import Policy
from sidecar.ledger.rules import PrepareSpec
from sidecar.storage.api import CallWrite, ReadView, Store, WriteView

T = TypeVar("T")
TOOL = "upsert_contact"
INPUT = Payload(PayloadKind.JSON, b'{"email": "a@example.com"}')


class SwitchablePolicy:
    """A `PolicySource` whose value the test replaces at will."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()

    def current(self) -> Policy:
        return self.policy


class ReloadBeforeWrite:
    """A `Store` that runs `reload` when a read is made or a write is queued:
    a reload that takes effect after the request arrived and before the
    ledger decides it (on its read), or after it decided and before its
    write (`save_call`) is applied. With `reads` False, only the second."""

    def __init__(
        self, inner: Store, reload: Callable[[], None], *, reads: bool = True
    ) -> None:
        self._inner = inner
        self.reload: Callable[[], None] | None = reload
        self._reads = reads

    @property
    def incarnation(self) -> int:
        return self._inner.incarnation

    @property
    def exclusive(self) -> bool:
        return self._inner.exclusive

    @property
    def reads_wait(self) -> bool:
        return self._inner.reads_wait

    @property
    def saves_by_statement(self) -> bool:
        return self._inner.saves_by_statement

    def read(self, fn: Callable[[ReadView], T]) -> T:
        if self.reload is not None and self._reads:
            self.reload()
        return self._inner.read(fn)

    def submit(self, fn: Callable[[WriteView], T]) -> Future[T]:
        if self.reload is not None:
            self.reload()
        return self._inner.submit(fn)

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        if self.reload is not None:
            self.reload()
        return await self._inner.write(fn)

    async def save_call(self, write: CallWrite) -> None:
        if self.reload is not None:
            self.reload()
        await self._inner.save_call(write)

    def close(self) -> None:
        self._inner.close()

    def backup(self, path: Path) -> int:
        return self._inner.backup(path)


def spec(
    call_id: str,
    effect: Effect = Effect.IDEMPOTENT_WRITE,
    *,
    start: bool = True,
    tool_name: str = TOOL,
    namespace: str = "default",
) -> PrepareSpec:
    return PrepareSpec(
        ref=CallRef(namespace, "run-1", call_id),
        tool_name=tool_name,
        effect=effect,
        input=INPUT,
        fingerprint=fingerprint(INPUT),
        require_approval=False,
        start=start,
        lease_ms=0,
    )
