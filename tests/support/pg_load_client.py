"""One agent process of the database-restart test: safe tool calls, one
after the other, until told to stop, each execution leaving a line in a
shared side-effect file.

Run as `python -m tests.support.pg_load_client TARGET PREFIX EFFECTS STOP OUT`.
Call `PREFIX-n` goes through `Run.call` (prepare and start, the tool, the
commit); its tool appends `PREFIX-n TOKEN` to EFFECTS (the external side
effect) and returns the bytes `PREFIX-n:TOKEN`. A call whose safe call failed
is repeated (at most `REPEATS` times), as an agent would. The process stops
once the file STOP exists (or after `MAX_CALLS` calls, or `MAX_SECONDS`) and
writes to OUT, as JSON: the calls acknowledged (the safe call handed a
result back) with that result, the errors seen (every recording retry's and
every failed safe call's), counted by what they said, and those that said
something other than UNAVAILABLE / STORAGE_UNAVAILABLE with
`mayHaveBeenApplied`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import secrets
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from effectd_client import (
    CallInProgress,
    Client,
    EffectdError,
    OutcomeUnknown,
    ReconciliationNeeded,
    RecordingRetry,
    Run,
)

MAX_CALLS = 2000
MAX_SECONDS = 120.0
REPEATS = 4
# Longer than any request may take in the daemon while the database is
# down (a write's retries, a pool's wait): every answer comes from it.
TIMEOUT = 60.0


class Seen:
    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()
        self.unclassified: list[str] = []

    def error(self, exc: BaseException) -> None:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, EffectdError):
            cause = cause.__cause__
        if cause is None:
            self.unclassified.append(repr(exc))
            return
        applied = cause.metadata.get("mayHaveBeenApplied")
        if (
            cause.code.name == "UNAVAILABLE"
            and cause.reason == "STORAGE_UNAVAILABLE"
            and applied in ("true", "false")
        ):
            self.errors[f"{type(exc).__name__}/applied={applied}"] += 1
        else:
            self.unclassified.append(f"{cause.code.name} {cause.reason} {cause}")


def _effect(effects: Path, call_id: str) -> bytes:
    token = secrets.token_hex(8)
    fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{call_id} {token}\n".encode())
    finally:
        os.close(fd)
    return f"{call_id}:{token}".encode()


def _one(run: Run, seen: Seen, effects: Path, call_id: str) -> bytes | str:
    """The call's result handed back, or how its safe call stopped."""
    for _ in range(REPEATS):
        try:
            with run.call("send", {"id": call_id}, call_id=call_id, raw=True) as step:
                if step.execute:
                    step.set_result(_effect(effects, call_id))
            assert isinstance(step.result, bytes)
            return step.result
        except CallInProgress:
            return "in progress"  # an earlier try's start committed
        except ReconciliationNeeded:
            return "reconcile"
        except (EffectdError, OutcomeUnknown) as exc:
            seen.error(exc)
            time.sleep(0.1)
    return "gave up"


def main(target: str, prefix: str, effects: Path, stop: Path, out: Path) -> int:
    # Every thread's stack on SIGUSR1: what a client that does not finish
    # was waiting for.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    seen = Seen()
    retry = RecordingRetry(
        attempts=20, deadline=90.0, on_retry=lambda error, _: seen.error(error)
    )
    acknowledged: dict[str, str] = {}
    stopped: Counter[str] = Counter()
    end = time.monotonic() + MAX_SECONDS
    with Client(target, timeout=TIMEOUT, recording_retry=retry) as client:
        run = Run(client, f"run-{prefix}")
        n = 0
        while n < MAX_CALLS and not stop.exists() and time.monotonic() < end:
            call_id = f"{prefix}-{n}"
            got = _one(run, seen, effects, call_id)
            if isinstance(got, bytes):
                acknowledged[call_id] = got.decode()
            else:
                stopped[got] += 1
            n += 1
    out.write_text(
        json.dumps(
            {
                "calls": n,
                "acknowledged": acknowledged,
                "stopped": stopped,
                "errors": seen.errors,
                "unclassified": seen.unclassified,
            }
        )
    )
    return 0


if __name__ == "__main__":
    target, prefix, effects, stop, out = sys.argv[1:6]
    raise SystemExit(main(target, prefix, Path(effects), Path(stop), Path(out)))
