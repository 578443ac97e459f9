"""Where a safe call's time goes in the daemon, from a py-spy raw profile.

    python bench/hotpath_profile.py PROFILE --rate 1000 --calls 400

Reads py-spy's collapsed stacks (`--format raw --threads`, as
`bench/hotpath.py --py-spy` records them) and splits the samples of the
daemon's two busy threads into what they were doing, in milliseconds per
call of the phase (samples / rate / calls):

  loop: serving      grpc.aio's per-call machinery and the asyncio loop's own
                     work (frames outside the daemon's code)
  loop: boundary     the gate and the request boundary (enter, admit,
                     deadline, record: metrics, access log)
  loop: translation  requests to domain values and back (`rpc/convert`,
                     `rpc/caller`, the servicers' own lines)
  loop: service      the services on the loop: reads, the submit to the
                     writer (which waits for the GIL the writer holds)
  loop: idle         waiting in the selector
  writer: commit     the LMDB commit: page writes and fsyncs
  writer: apply      the write functions (decode, rule, encode, usage)
  writer: answer     resolving the futures, waking the loop
  writer: idle       waiting for work

py-spy counts a thread blocked in C (an fsync, a GIL wait) as busy: shares
are of wall time per thread, not of CPU.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

LOOP = "MainThread"
WRITER = "effectd-writer"
CATEGORIES = (
    "loop: serving",
    "loop: boundary",
    "loop: translation",
    "loop: service",
    "loop: idle",
    "writer: commit",
    "writer: apply",
    "writer: answer",
    "writer: idle",
)
_BOUNDARY = ("rpc/boundary.py", "rpc/gate.py", "rpc/recording.py", "observability/")
_TRANSLATION = ("rpc/convert.py", "rpc/caller.py", "rpc/ledger.py", "rpc/recovery.py")
_SERVICE = ("sidecar/services/", "sidecar/storage/", "sidecar/ledger/")


def _loop(frames: list[str]) -> str:
    leaf = frames[-1]
    if "select (selectors.py)" in leaf:
        return "loop: idle"
    for frame in reversed(frames):
        if any(p in frame for p in _SERVICE):
            return "loop: service"
        if any(p in frame for p in _TRANSLATION):
            return "loop: translation"
        if any(p in frame for p in _BOUNDARY):
            return "loop: boundary"
    return "loop: serving"


def _writer(frames: list[str]) -> str:
    if any("_resolve (sidecar/storage/lmdb/store.py)" in f for f in frames):
        return "writer: answer"
    if any("LmdbStore._apply" in f for f in frames):
        return "writer: apply"
    if "LmdbStore._commit" in frames[-1]:
        return "writer: commit"
    if any("LmdbStore._commit" in f for f in frames):
        return "writer: apply"  # the commit's own Python: metrics, stats
    return "writer: idle"


def split(lines: Iterable[str]) -> Counter[str]:
    """Samples per category (threads other than the two are left out)."""
    out: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if LOOP in frames[0]:
            out[_loop(frames)] += int(count)
        elif WRITER in frames[0]:
            out[_writer(frames)] += int(count)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", type=Path, nargs="+")
    p.add_argument("--rate", type=int, required=True, help="py-spy samples/s")
    p.add_argument("--calls", type=int, required=True, help="calls in the phase")
    args = p.parse_args(argv)
    per_call = 1000 / args.rate / args.calls
    counts = [split(path.read_text().splitlines()) for path in args.profile]
    names = [f"{path.parent.name}/{path.stem}" for path in args.profile]
    print(f"{'ms per call':<18}" + "".join(f"{n:>20}" for n in names))
    for category in CATEGORIES:
        cells = "".join(f"{c[category] * per_call:>20.3f}" for c in counts)
        print(f"{category:<18}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
