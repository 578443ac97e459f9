"""Where a safe call's daemon CPU goes, by layer, from a py-spy raw profile.

    python bench/hotpath_profile.py PROFILE... --rate 250 --calls 400 \
        [--cpu-ms 1.2]

Reads py-spy's collapsed stacks (`--format raw --threads --gil`, as
`bench/hotpath.py --py-spy` records them: a sample is the thread that held
the interpreter lock) and splits the daemon's samples into layers, in
milliseconds per call of the phase (samples / rate / calls); with
`--cpu-ms`, the measured CPU time per call, each layer's share of the
samples is given as its share of that time instead, which is what a
budget adds up to:

  serving       grpc.aio's machinery and the asyncio loop's own work
                (frames outside the daemon's code, and the session stream's
                own calls of gRPC's send and receive), on the loop thread
  boundary      the gate, the request boundary, the session stream, the
                messages, admission, recording (metrics, access log, span)
  translation   requests to domain values and back (`rpc/convert`,
                `rpc/caller`, the servicers' own lines)
  rules         the services and the ledger's rules
  records       the store's reads and the records' encoding, decoding and
                indexes (`storage/` but the commit)
  commit        the LMDB commit itself: page writes and syncs
  other threads gRPC's poller thread, the writer thread, the rest
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

LOOP = "MainThread"
LAYERS = (
    "serving",
    "boundary",
    "translation",
    "rules",
    "records",
    "commit",
    "other threads",
)
_BOUNDARY = (
    "rpc/boundary.py",
    "rpc/gate.py",
    "rpc/recording.py",
    "rpc/session.py",
    "rpc/messages.py",
    "rpc/admission.py",
    "rpc/concurrency.py",
    "sidecar/callstate.py",
    "sidecar/tracecontext.py",
    "sidecar/auth/",
    "observability/",
)
_TRANSLATION = ("rpc/convert.py", "rpc/caller.py", "rpc/ledger.py", "rpc/errors.py")
_RULES = ("sidecar/services/", "sidecar/ledger/")
_RECORDS = ("sidecar/storage/",)
_OWN = (
    ("records", _RECORDS),
    ("rules", _RULES),
    ("translation", _TRANSLATION),
    ("boundary", _BOUNDARY),
)
# The session stream's lines that call into gRPC's Cython (its send and its
# receive): their own time is gRPC's.
_GRPC_CALLS = ("_Stream._write (sidecar/rpc/session.py)", "_Stream._read (sidecar")
_COMMIT = "LmdbStore._commit (sidecar/storage/lmdb"


def layer(frames: list[str]) -> str:
    """The layer of one sample's stack (the thread first, the leaf last)."""
    if LOOP not in frames[0]:
        return "other threads"
    if _COMMIT in frames[-1]:
        return "commit"
    if any(f in frames[-1] for f in _GRPC_CALLS):
        return "serving"
    # The innermost frame of the daemon's own code names the layer.
    for frame in reversed(frames):
        for name, parts in _OWN:
            if any(p in frame for p in parts):
                return name
    return "serving"


def split(lines: Iterable[str]) -> Counter[str]:
    """Samples per layer."""
    out: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        out[layer(stack.split(";"))] += int(count)
    return out


def per_call(
    counts: Counter[str], *, rate: int, calls: int, cpu_ms: float | None = None
) -> dict[str, float]:
    """Milliseconds per call of each layer: of sampled time, or (with
    `cpu_ms`) each layer's share of the measured CPU per call."""
    total = sum(counts.values())
    if cpu_ms is not None:
        return {k: cpu_ms * counts[k] / total if total else 0.0 for k in LAYERS}
    return {k: 1000 * counts[k] / rate / calls for k in LAYERS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", type=Path, nargs="+")
    p.add_argument("--rate", type=int, required=True, help="py-spy samples/s")
    p.add_argument("--calls", type=int, required=True, help="calls in the phase")
    p.add_argument("--cpu-ms", type=float, help="measured CPU ms per call")
    args = p.parse_args(argv)
    cells = [
        per_call(
            split(path.read_text().splitlines()),
            rate=args.rate,
            calls=args.calls,
            cpu_ms=args.cpu_ms,
        )
        for path in args.profile
    ]
    names = [f"{path.parent.name}/{path.stem}" for path in args.profile]
    print(f"{'ms per call':<16}" + "".join(f"{n:>22}" for n in names))
    for name in LAYERS:
        print(f"{name:<16}" + "".join(f"{c[name]:>22.3f}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
