"""Admission: whether a call may run now (contract §10.3).

A call takes one of its caller's concurrency slots (`sidecar.rpc.concurrency`)
and then one token of its caller's rate limit; over either it is refused
before its handler runs. The slot comes first, so a call refused for
concurrency costs no token. Health is never rate-limited, nor is a call that
records work already done (`RECORDS_WORK_DONE`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sidecar.auth.access import OPEN_METHODS
from sidecar.ledger.quota import Caller
from sidecar.rpc.concurrency import Pool, Slots

# The RPCs that record work already done: the tool has run (or may have), and
# its result must always be recordable, so no rate limit refuses them and they
# have concurrency slots of their own.
RECORDS_WORK_DONE = frozenset(
    {
        "/effectd.v1.ToolLedger/CommitTool",
        "/effectd.v1.ToolLedger/ReportUnknown",
        "/effectd.v1.ToolLedger/Heartbeat",
        "/effectd.v1.Recovery/AcknowledgeRecovery",
    }
)

# The concurrency pool of each RPC that does not take an ordinary slot; None:
# never counted (health checks are answered whatever the load).
_POOLS: dict[str, Pool | None] = {
    **dict.fromkeys(RECORDS_WORK_DONE, Pool.RECORDING),
    "/grpc.health.v1.Health/Watch": Pool.HEALTH_WATCH,
    "/grpc.health.v1.Health/Check": None,
    "/effectd.v1.ToolLedger/Session": Pool.SESSION,
}


class RateLimit(Protocol):
    """Charges one request to a caller (`sidecar.ledger.quota.RateLimiter`)."""

    def admit(self, caller: Caller) -> None: ...


def admit(
    method: str, charged: Caller, slots: Slots | None, rate: RateLimit | None
) -> Callable[[], None] | None:
    """Admits one call of `method` charged to `charged`; returns what gives
    its slot back (None: it took none).

    Raises:
        Throttled: over the caller's concurrency or rate limit (it then
            holds no slot).
    """
    release: Callable[[], None] | None = None
    pool = _POOLS.get(method, Pool.ORDINARY)
    if slots is not None and pool is not None:
        release = slots.take(pool, charged)
    exempt = method in RECORDS_WORK_DONE or method in OPEN_METHODS
    if rate is None or exempt:
        return release
    try:
        rate.admit(charged)
    except BaseException:
        if release is not None:
            release()
        raise
    return release
