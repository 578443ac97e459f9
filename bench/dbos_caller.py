"""One caller of the DBOS side of `bench/versus_dbos.py`, run in the bench's
DBOS venv (never the project's): a workflow per tool call, started with
`SetWorkflowID(key)`, whose one step is the tool's body. DBOS records the
workflow (durably, before the body) and checkpoints the step after it; the
duplicate starts the same workflow id again and DBOS returns the stored
output. This is the DBOS shape that records a call before its body runs.

    python dbos_caller.py URL EXECUTOR PHASE PREFIX FIRST COUNT

Prints "ready" once launched and warmed up, waits for a line on stdin, runs
the phase and prints one JSON line: latencies (ns), its wall-clock start and
end, how many times the body ran per key, and the keys whose answer was not
their own result.
"""

# Type-checked by the project's mypy, where dbos is not installed (a module
# of unknown types), and run by the bench venv's python, where it is.
from __future__ import annotations

import json
import sys
import time

from dbos import DBOS, DBOSConfig, SetWorkflowID


def main() -> int:
    url, executor, phase, prefix, first, count = sys.argv[1:7]
    ran: dict[str, int] = {}
    config: DBOSConfig = {
        "name": "effectd-bench",
        "system_database_url": url,
        "sys_db_pool_size": 3,
        "executor_id": executor,
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()  # type: ignore[untyped-decorator]
    def body(key: str) -> str:
        ran[key] = ran.get(key, 0) + 1
        return "result-" + key

    @DBOS.workflow()  # type: ignore[untyped-decorator]
    def tool_call(key: str) -> str:
        return str(body(key))

    DBOS.launch()
    for i in range(5):  # warm-up keys of their own
        with SetWorkflowID(f"{prefix}-warm-{executor}-{i}"):
            tool_call(f"{prefix}-warm-{executor}-{i}")
    print("ready", flush=True)
    sys.stdin.readline()
    latencies: list[int] = []
    wrong: list[str] = []
    keys = [f"{prefix}-{i}" for i in range(int(first), int(first) + int(count))]
    began = time.time()
    for key in keys:
        start = time.perf_counter_ns()
        with SetWorkflowID(key):
            out = tool_call(key)
        latencies.append(time.perf_counter_ns() - start)
        if out != "result-" + key:
            wrong.append(key)
    ended = time.time()
    bodies = {k: ran.get(k, 0) for k in keys}
    print(
        json.dumps(
            {
                "phase": phase,
                "latencies": latencies,
                "began": began,
                "ended": ended,
                "bodies": bodies,
                "wrong": wrong,
            }
        ),
        flush=True,
    )
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
