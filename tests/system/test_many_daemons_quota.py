"""An open-call quota is exact across daemons (issue 14): three `effectd
serve` processes on one PostgreSQL store, each with `--quota-open-calls`,
and callers at all three creating calls of one namespace at once, wave
after wave. Exactly as many calls are admitted as the quota allows, never
more, every other prepare is refused QUOTA_EXCEEDED, and the namespace
holds exactly the admitted calls. Each round is a namespace of its own.

The negative control is the same daemons on a store whose READ COMMITTED
writes lock nothing (`tests.support.loose_store`): each daemon counts only what
is committed, and the same check catches more calls admitted than the
quota. The test fails, never skips, when PostgreSQL is not reachable.

A byte quota counts the results committed at every daemon (issue 25 item
17): results committed at once at other daemons than the one that admitted
their calls are all recorded, and take the namespace past its quota; then
every daemon refuses its next new call and shows it over by the same bytes.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from effectd.v1 import admin_pb2 as apb
from effectd.v1.admin_pb2_grpc import AdminStub

from effectd_client import Client, EffectdError, QuotaExceeded, State
from tests.support.processes import daemon_processes

pytestmark = pytest.mark.slow

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


BYTE_QUOTA = 64 << 10
CALLS_PER_DAEMON = 2
RESULT = {"text": "r" * 30_000}


def _stored_and_over(target: str, namespace: str) -> tuple[int, int]:
    with grpc.insecure_channel(target) as channel:
        stats = AdminStub(channel).GetStats(
            apb.GetStatsRequest(namespace=namespace), timeout=30
        )
    [found] = stats.namespaces
    return found.stored_bytes, found.stored_bytes_over_quota


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_committed_at_other_daemons_stop_new_calls_at_every_daemon(
    short_tmp: Path, pg_url: str
) -> None:
    """Six calls admitted under a 64 KiB byte quota, two at each of three
    daemons, commit 30 KB results at once, each at another daemon than
    the one that admitted it: every commit is recorded; then each daemon
    refuses the namespace's next new prepare QUOTA_EXCEEDED on stored_bytes,
    and each shows it over its quota by the same bytes, while another
    namespace is served at each."""
    args = ("--store", pg_url, "--quota-stored-bytes", str(BYTE_QUOTA))
    dirs = [short_tmp / f"d{i}" for i in range(DAEMONS)]
    with daemon_processes(dirs, "sidecar", args) as daemons, ExitStack() as stack:
        targets = [d.target for d in daemons]
        big = [stack.enter_context(Client(t, namespace="big")) for t in targets]
        calls = [
            (d, f"c{d}-{j}") for d in range(DAEMONS) for j in range(CALLS_PER_DAEMON)
        ]
        for d, call_id in calls:
            big[d].prepare_tool("run", call_id, "charge", {"c": call_id}, start=True)
        states: list[State] = []
        barrier = threading.Barrier(len(calls), timeout=30)

        def commit(d: int, call_id: str) -> None:
            barrier.wait()
            done = big[(d + 1) % DAEMONS].commit_tool("run", call_id, 1, RESULT)
            states.append(done.state)

        threads = [threading.Thread(target=commit, args=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert states == [State.COMMITTED] * len(calls)
        seen = {_stored_and_over(t, "big") for t in targets}
        [(stored, over)] = seen
        assert stored > len(calls) * 30_000
        assert over == stored - BYTE_QUOTA
        for d, client in enumerate(big):
            with pytest.raises(QuotaExceeded) as info:
                client.prepare_tool("run", f"new-{d}", "charge", {})
            assert info.value.metadata["quota"] == "stored_bytes"
            with Client(targets[d], namespace="small") as small:
                small.prepare_tool("run", f"new-{d}", "charge", {}, start=True)
