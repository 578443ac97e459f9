"""Which way a client's hot ledger requests travel: as messages of a
session (`wanted`), or as unary calls, each a callable like a stub's method
(`LedgerCalls`); the sessions themselves are `effectd_client._session`,
`_session_aio`, `_frames` and `_frames_aio`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from effectd_client._session_wire import FIELDS

SESSION_ENV = "EFFECTD_SESSION"
_OFF = frozenset({"0", "false", "off"})


def wanted(session: bool | None) -> bool:
    """Whether a client sends them as a session's messages (on the framed
    socket or the gRPC stream): `session` when given, else yes unless
    `EFFECTD_SESSION` is 0, false or off (as the Node client)."""
    if session is not None:
        return session
    return os.environ.get(SESSION_ENV, "").strip().lower() not in _OFF


class LedgerCalls:
    """The ledger RPCs a session carries, each a callable like a stub's
    method (`(request, timeout=, metadata=)`): the session's, or the unary
    stub's when there is no session."""

    PrepareTool: Callable[..., Any]
    PrepareTools: Callable[..., Any]
    StartTool: Callable[..., Any]
    CommitTool: Callable[..., Any]
    ReportUnknown: Callable[..., Any]
    Heartbeat: Callable[..., Any]
    GetToolCall: Callable[..., Any]

    def __init__(
        self,
        stub: object,
        method: Callable[[str, Callable[..., Any]], Callable[..., Any]] | None,
    ) -> None:
        for name in FIELDS:
            unary = getattr(stub, name)
            setattr(self, name, unary if method is None else method(name, unary))
