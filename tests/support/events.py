"""Waiting on what the daemon reports, never on the wall clock.

A test that needs "the call has ended" or "the stop has begun" waits for the
daemon to say so: a line of its log (`watching`), or a change of its health
(`health_changes`). The timeouts are bounds for a broken build, not waits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class Logged(logging.Handler):
    """The records of one logger as they come, for a test to wait on."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    def wait_for(
        self, match: Callable[[logging.LogRecord], bool], timeout: float = 30.0
    ) -> logging.LogRecord | None:
        """The first record `match` accepts, waiting for it; None if none
        came within `timeout` seconds."""

        def found() -> logging.LogRecord | None:
            return next((r for r in self.records if match(r)), None)

        with self._changed:
            return self._changed.wait_for(found, timeout)


@contextmanager
def watching(name: str, level: int = logging.DEBUG) -> Iterator[Logged]:
    """Records what logger `name` logs at `level` and above within the block."""
    logger = logging.getLogger(name)
    handler = Logged()
    old = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def rpc_ended(method: str) -> Callable[[logging.LogRecord], bool]:
    """Matches the gate's access-log line of `method` (full gRPC name): it
    is logged once the call's handler has ended, however it ended."""
    return lambda r: r.name == "effectd.access" and r.__dict__.get("method") == method


@contextmanager
def health_changes(target: str) -> Iterator[Callable[[], int]]:
    """A `grpc.health.v1.Health/Watch` of the whole server at `target`;
    yields a function that returns its next status (a
    `HealthCheckResponse.ServingStatus`) as it is sent."""
    with grpc.insecure_channel(target) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(), timeout=60
        )
        try:
            yield lambda: int(next(stream).status)
        finally:
            stream.cancel()
