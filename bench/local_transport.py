"""The framed local transport against the gRPC session stream, A/B, in one run.

    .venv/bin/python bench/local_transport.py [--rounds 2] [--seconds 4]

One daemon on its defaults (LMDB, fsync on) with `--local-frames`. Callers
are processes, each with one call in flight; the same safe call on both
transports, built from the same protobuf messages: PrepareTool(start) of a
new key, then CommitTool(acknowledge) of its result (`first`); the same
PrepareTool again, answered RETURN_RESULT (`dup`). Only how the messages
travel differs:

  grpc    the Python client's sync session (`effectd_client._session`: one
          `ToolLedger.Session` stream, a sending thread, a reader thread)
  frames  length-prefixed SessionRequest / SessionResponse frames on the
          daemon's `effectd.frames.sock`, a blocking socket, no thread

At 1 and 32 callers, for a fixed time each, the transports alternated
within each round: calls/s, p50 and p99 latency, and the CPU per call of the
daemon and of the callers (/proc, the callers' own from their start of the
phase). Every call is checked: a first execution must be EXECUTE, its
duplicate RETURN_RESULT. Ratios frames / grpc per round, then the median.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_HEADER = struct.Struct(">I")


def _prepare(pb: Any, run: str, key: int) -> Any:
    return pb.PrepareToolRequest(
        ref=pb.CallRef(run_id=run, call_id=f"c{key}"),
        tool_name="pay",
        input=pb.Payload(json=f'{{"i":{key}}}'),
        start=True,
    )


def _commit(pb: Any, run: str, key: int, attempt: int) -> Any:
    return pb.CommitToolRequest(
        ref=pb.CallRef(run_id=run, call_id=f"c{key}"),
        attempt=attempt,
        result=pb.ToolResult(outcome=pb.OUTCOME_OK, payload=pb.Payload(json="1")),
        acknowledge=True,
    )


class _Frames:
    """One connection of the framed transport, one message in flight."""

    def __init__(self, path: str, pb: Any) -> None:
        self._pb = pb
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.connect(path)
        self._file = self._sock.makefile("rb")
        self._id = 0
        self._send(pb.SessionHello(version=1))

    def _send(self, message: Any) -> None:
        data = message.SerializeToString()
        self._sock.sendall(_HEADER.pack(len(data)) + data)

    def call(self, field: str, request: Any) -> Any:
        self._id += 1
        self._send(self._pb.SessionRequest(id=self._id, **{field: request}))
        (size,) = _HEADER.unpack(self._file.read(_HEADER.size))
        answer = self._pb.SessionResponse.FromString(self._file.read(size))
        if answer.id != self._id or answer.WhichOneof("response") != field:
            raise RuntimeError(f"unexpected answer {answer}")
        return getattr(answer, field)


def caller_main(transport: str, target: str, run: str, seconds: float) -> int:
    import grpc  # noqa: PLC0415
    from effectd.v1 import ledger_pb2 as pb  # noqa: PLC0415

    from effectd_client._frames_wire import frames_of  # noqa: PLC0415
    from effectd_client._session import Session  # noqa: PLC0415

    if transport == "grpc":
        channel = grpc.insecure_channel(target)
        session = Session(channel, ())

        def call(field: str, request: Any) -> Any:
            name = "PrepareTool" if field == "prepare_tool" else "CommitTool"
            return session.call(name, request, 30.0)
    else:
        frames = _Frames(frames_of(target.removeprefix("unix:")), pb)
        call = frames.call
    # Warm-up: a few keys of the caller's own.
    for key in range(-5, 0):
        started = call("prepare_tool", _prepare(pb, run, key))
        call("commit_tool", _commit(pb, run, key, started.call.attempt))
    print("ready", flush=True)
    sys.stdin.readline()
    out: dict[str, Any] = {}
    for phase in ("first", "dup"):
        times = os.times()
        cpu = times.user + times.system
        latencies: list[float] = []
        end = time.monotonic() + seconds
        key = 0
        limit = out["first"]["calls"] if phase == "dup" else 10**9
        while time.monotonic() < end and key < limit:
            began = time.perf_counter()
            answer = call("prepare_tool", _prepare(pb, run, key))
            if phase == "first":
                if answer.decision != pb.DECISION_EXECUTE:
                    raise RuntimeError(f"key {key}: {answer.decision}")
                call("commit_tool", _commit(pb, run, key, answer.call.attempt))
            elif answer.decision != pb.DECISION_RETURN_RESULT:
                raise RuntimeError(f"duplicate {key}: {answer.decision}")
            latencies.append(time.perf_counter() - began)
            key += 1
        times = os.times()
        out[phase] = {
            "calls": key,
            "cpu": times.user + times.system - cpu,
            "latencies": latencies,
        }
        print(json.dumps({"phase": phase, **out[phase]}), flush=True)
        sys.stdin.readline()
    return 0


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _point(
    target: str, daemon: int, transport: str, callers: int, *, tag: str, seconds: float
) -> dict[str, dict[str, float]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "caller",
                transport,
                target,
                f"{tag}-{i}",
                str(seconds),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(callers)
    ]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("a caller did not start")
    result = {}
    for phase in ("first", "dup"):
        before, began = _cpu(daemon), time.monotonic()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("\n")
            p.stdin.flush()
        rows = []
        for p in procs:
            assert p.stdout is not None
            rows.append(json.loads(p.stdout.readline()))
        wall = time.monotonic() - began
        calls = sum(r["calls"] for r in rows)
        latencies = sorted(x for r in rows for x in r["latencies"])
        result[phase] = {
            "calls/s": calls / wall,
            "p50 ms": latencies[len(latencies) // 2] * 1e3,
            "p99 ms": latencies[int(len(latencies) * 0.99)] * 1e3,
            "daemon ms": (_cpu(daemon) - before) * 1e3 / calls,
            "callers ms": sum(r["cpu"] for r in rows) * 1e3 / calls,
        }
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
        if p.wait(60) != 0:
            raise RuntimeError("a caller failed")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from lifecycle import _daemon  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="effectd-frames-", dir="/tmp") as tmp:
        proc = _daemon(f"{tmp}/d", "--local-frames")
        target = f"unix:{tmp}/d/effectd.sock"
        points: dict[tuple[str, int, str], list[dict[str, float]]] = {}
        try:
            for rnd in range(args.rounds):
                order = ("grpc", "frames") if rnd % 2 == 0 else ("frames", "grpc")
                for callers in args.callers:
                    for transport in order:
                        got = _point(
                            target,
                            proc.pid,
                            transport,
                            callers,
                            tag=f"r{rnd}{transport}{callers}",
                            seconds=args.seconds,
                        )
                        for phase, row in got.items():
                            key = (transport, callers, phase)
                            points.setdefault(key, []).append(row)
        finally:
            proc.terminate()
            proc.wait(30)
    _print(points, args)
    return 0


def _print(
    points: dict[tuple[str, int, str], list[dict[str, float]]], args: argparse.Namespace
) -> None:
    columns = ("calls/s", "p50 ms", "p99 ms", "daemon ms", "callers ms")
    print(
        f"effectd, framed transport against the gRPC session; {args.rounds} "
        f"rounds of {args.seconds:g} s, medians"
    )
    print(
        f"{'transport':<10}{'phase':<7}{'callers':>8}"
        + "".join(f"{c:>12}" for c in columns)
    )
    for (transport, callers, phase), rows in sorted(points.items()):
        values = [statistics.median(r[c] for r in rows) for c in columns]
        print(
            f"{transport:<10}{phase:<7}{callers:>8}"
            + "".join(f"{v:>12.2f}" for v in values)
        )
    print("\nframes / grpc, calls/s (per round)")
    for callers in args.callers:
        for phase in ("first", "dup"):
            ratios = [
                f["calls/s"] / g["calls/s"]
                for f, g in zip(
                    points[("frames", callers, phase)],
                    points[("grpc", callers, phase)],
                    strict=True,
                )
            ]
            shown = ", ".join(f"{r:.2f}" for r in ratios)
            print(
                f"  {phase:<6}{callers:>3} callers: "
                f"{statistics.median(ratios):.2f} [{shown}]"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "caller":
        raise SystemExit(
            caller_main(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
        )
    raise SystemExit(main())
