"""An open-call quota is exact across daemons (issue 14): three `effectd
serve` processes on one PostgreSQL store, each with `--quota-open-calls`,
and callers at all three creating calls of one namespace at once, wave
after wave. Exactly as many calls are admitted as the quota allows, never
more, every other prepare is refused QUOTA_EXCEEDED, and the namespace
holds exactly the admitted calls. Each round is a namespace of its own.

The negative control is the same daemons on a store whose writes run under
READ COMMITTED (`tests.support.loose_store`): each daemon counts only what
is committed, and the same check catches more calls admitted than the
quota. The test fails, never skips, when PostgreSQL is not reachable.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest

from effectd_client import Client, EffectdError
from tests.support.processes import daemon_processes

DAEMONS = 3
CALLERS_PER_DAEMON = 6
WAVES = 3
QUOTA = 8
ROUNDS = int(os.environ.get("EFFECTD_QUOTA_ROUNDS", "6"))
CONTROL_ROUNDS = 3


def _round(targets: list[str], namespace: str) -> tuple[Counter[str], int]:
    """What the prepares of every caller were answered (a decision's name or
    a refusal's reason), and the open calls the namespace holds after."""
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    callers = len(targets) * CALLERS_PER_DAEMON
    barrier = threading.Barrier(callers, timeout=30)
    with ExitStack() as stack:
        clients = [stack.enter_context(Client(t, namespace=namespace)) for t in targets]

        def call(caller: int) -> None:
            client = clients[caller % len(clients)]
            for wave in range(WAVES):
                barrier.wait()
                try:
                    got = client.prepare_tool(
                        "run", f"c{caller}-w{wave}", "charge", {"n": caller}
                    ).decision.name
                except EffectdError as exc:
                    got = exc.reason
                with lock:
                    answers[got] += 1

        threads = [threading.Thread(target=call, args=(c,)) for c in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        held = len(list(clients[0].list_tool_calls("run")))
    return answers, held


def _violations(short_tmp: Path, url: str, module: str, rounds: int) -> list[str]:
    print(
        f"{DAEMONS} daemons ({module}), quota {QUOTA}, {rounds} rounds of "
        f"{WAVES} waves of {DAEMONS * CALLERS_PER_DAEMON} prepares"
    )
    args = ("--store", url, "--quota-open-calls", str(QUOTA))
    dirs = [short_tmp / f"d{i}" for i in range(DAEMONS)]
    found = []
    with daemon_processes(dirs, module, args) as daemons:
        targets = [d.target for d in daemons]
        for r in range(rounds):
            answers, held = _round(targets, f"quota-{r}")
            print(f"round {r}: {dict(answers)}, {held} held")
            admitted = answers["EXECUTE"]
            if (
                admitted != QUOTA
                or held != admitted
                or set(answers) - {"EXECUTE", "QUOTA_EXCEEDED"}
            ):
                found.append(f"round {r}: {dict(answers)}, {held} held")
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_daemons_never_admit_more_than_the_quota(
    short_tmp: Path, pg_url: str
) -> None:
    assert _violations(short_tmp, pg_url, "sidecar", ROUNDS) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_negative_control_a_store_without_isolation_is_caught(
    short_tmp: Path, pg_url: str
) -> None:
    found = _violations(short_tmp, pg_url, "tests.support.loose_store", CONTROL_ROUNDS)
    print("\n".join(found))
    assert found
