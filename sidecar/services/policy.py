"""The policy service: reloads the policy file with its audit entry (ADR-010 R2).

A reload reads and validates the whole file, writes the change (who, when,
the old and the new policy) to the audit log in one write transaction, and
only once that entry is durable puts the new policy in force, as one value:
the next decision sees all of it, no request sees half of it. A file that
does not validate changes nothing and is refused with a message that names
the setting. Reloads are serialized, so the audit log lists them in the
order they took effect.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sidecar.clock import Clock
from sidecar.errors import NoPolicyFile, PolicyInvalid
from sidecar.ledger import audit, policy_change
from sidecar.ledger.policy import Policy, PolicySource
from sidecar.policy_file import PolicyError, PolicyFile
from sidecar.storage.api import LedgerWrites, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reload:
    """A reload that took effect."""

    previous: Policy
    policy: Policy
    # The settings that differ, by their policy-file names.
    changed: tuple[str, ...]
    entry: audit.Entry
    source: str


class PolicyService:
    def __init__(self, store: Store, clock: Clock, source: PolicySource) -> None:
        self._store = store
        self._clock = clock
        self._source = source

    def current(self) -> Policy:
        return self._source.current()

    async def reload(self, *, actor: str, reason: str = "") -> Reload:
        """Reads the policy file again and puts it in force with its audit entry.

        Raises:
            NoPolicyFile: the daemon runs without a policy file.
            PolicyInvalid: the file is unreadable or invalid; the policy in
                force stays.
        """
        source = self._source
        if not isinstance(source, PolicyFile):
            raise NoPolicyFile(
                "the daemon was started without a policy file "
                "(effectd serve --policy FILE): there is nothing to reload"
            )
        # Reading the file and waiting for the audit write would block the
        # event loop: the reload runs in a worker thread.
        done = await asyncio.to_thread(self._reload, source, actor, reason)
        log.info(
            "policy reloaded from %s by %s (audit entry %d); changed: %s",
            done.source,
            actor,
            done.entry.sequence,
            ", ".join(done.changed) or "nothing",
            extra={"action": audit.Action.POLICY_RELOAD.value, "actor": actor},
        )
        return done

    def _reload(self, source: PolicyFile, actor: str, reason: str) -> Reload:
        written: list[audit.Entry] = []
        path = str(source.path)

        def commit(old: Policy, new: Policy) -> None:
            fact = policy_change.fact(
                old,
                new,
                at_ns=self._clock.wall_ns(),
                actor=actor,
                reason=reason,
                source=path,
            )

            def append(view: LedgerWrites) -> audit.Entry:
                return view.append_audit(fact)

            # Durable before the new policy decides anything.
            written.append(self._store.submit(append).result())

        try:
            old, new = source.reload(commit)
        except PolicyError as exc:
            raise PolicyInvalid(
                f"the policy file was refused, the policy in force stays: {exc}",
                {"file": path},
            ) from exc
        return Reload(
            old, new, tuple(policy_change.changes(old, new)), written[0], path
        )
