"""A test build of the daemon: `effectd serve` with the failpoints of
`EFFECTD_FAILPOINTS` armed in its store (`sidecar.failpoints`).

Run as `python -m tests.support.failpoint_daemon serve --data-dir D`, or
forked by `tests.torture.crashing`; at an armed failpoint the process exits
with `failpoints.CRASH_EXIT`. `BROKEN` names the builds broken on purpose
that the failpoint table must catch.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from sidecar import callstate, cli, failpoints, server
from sidecar.config import ServeConfig
from sidecar.rpc import summaries
from sidecar.seams import Seams
from sidecar.storage.api import ReadView, Store, WriteView
from sidecar.storage.lmdb import answers
from sidecar.storage.lmdb.store import LmdbOptions, LmdbStore, _Item

T = TypeVar("T")
# The variable that picks a broken build in a forked child.
BROKEN_ENV = "EFFECTD_TEST_BROKEN"
ANSWERS_BEFORE_COMMIT = "answers_before_commit"


def current_method() -> str:
    """The method of the RPC (or session message) being served; ""."""
    state = callstate.CURRENT.get()
    return "" if state is None else state.method


class AnswersBeforeCommit(LmdbStore):
    """BROKEN on purpose: answers a batch, then commits it."""

    # Its reads may wait (below): off the event loop, on worker threads.
    reads_wait = True

    def read(self, fn: Callable[[ReadView], T]) -> T:
        # A read waits for the commit in flight, so that a request after an
        # answered write finds it (as it would once committed).
        with self._txn:
            pass
        return super().read(fn)

    async def write(self, fn: Callable[[WriteView], T]) -> T:
        # Through the writer thread, so the loop is free to send the answer.
        return await asyncio.wrap_future(self.submit(fn))

    def _commit(self, batch: list[_Item]) -> None:
        failpoints_ = self.options.failpoints
        with self._env.begin(write=True) as txn:
            outcomes, _ = self._apply(txn, batch)
            answers.resolve(outcomes)
            time.sleep(1.0)  # the answer leaves
            if failpoints_ is not None:
                fns = [fn for fn, _ in batch]
                failpoints_.reached(failpoints.Point.LMDB_BEFORE_COMMIT, fns)


class FailpointDaemon(server.Daemon):
    def __init__(self, config: ServeConfig, seams: Seams | None = None) -> None:
        spec = os.environ.get(failpoints.ENV, "")
        armed = failpoints.Failpoints(spec, current_method) if spec else None
        super().__init__(config, Seams(failpoints=armed))

    def open_store(self) -> Store:
        if os.environ.get(BROKEN_ENV) != ANSWERS_BEFORE_COMMIT:
            return super().open_store()
        options = LmdbOptions(
            failpoints=self.seams.failpoints, summarize=summaries.summarize
        )
        return AnswersBeforeCommit(self.config.data_dir, options)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return cli.main(argv, daemon_class=FailpointDaemon, test_build=True)
    except failpoints.FailpointError as exc:
        print(f"effectd: {exc}", file=sys.stderr)
        return 2


def serve_forked(argv: list[str], spec: str, log: str, broken: str) -> None:
    """A forked child's body (`tests.torture.crashing`): its output to `log`,
    the failpoints `spec` armed, the build `broken` ("": the real one), then
    the test build's `main`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for name, value in ((failpoints.ENV, spec), (BROKEN_ENV, broken)):
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
