"""A health probe for containers and service managers: exit 0 if and only if
the daemon's `grpc.health.v1` service answers SERVING.

`python -m sidecar.probe [TARGET]` is what the image's HEALTHCHECK runs: it
needs no shell, no curl and no extra binary, only the daemon's own Python and
grpcio. A daemon that is stopping answers NOT_SERVING during its grace period
(contract §10.9), so a probe during shutdown fails as it should; a daemon that is
not there fails with its own exit code, so a script can tell the two apart.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_TIMEOUT_SECONDS = 3.0

# Exit codes; 3 matches `effectd ctl`'s "daemon not reachable".
SERVING = 0
NOT_SERVING = 1
USAGE = 2
UNREACHABLE = 3


def default_target(environ: Mapping[str, str] | None = None) -> str:
    """The daemon's own socket, found as `effectd serve` finds it:
    `EFFECTD_SOCKET`, else `EFFECTD_DATA_DIR/effectd.sock`, else
    `.effectd/effectd.sock`."""
    env = os.environ if environ is None else environ
    socket = env.get("EFFECTD_SOCKET")
    if socket:
        return f"unix:{socket}"
    data_dir = Path(env.get("EFFECTD_DATA_DIR") or ".effectd")
    return f"unix:{data_dir / 'effectd.sock'}"


def grpc_target(target: str) -> str:
    """A gRPC target; a bare filesystem path means that Unix socket."""
    if target.startswith(("/", "./", "../")):
        return f"unix:{target}"
    return target


def check(target: str, *, service: str = "", timeout: float) -> int:
    """One `Health.Check`; returns the exit code and prints one line on why.

    The call does not wait for the channel to become ready: an absent daemon
    fails at once with UNAVAILABLE rather than after the whole timeout.
    """
    try:
        with grpc.insecure_channel(grpc_target(target)) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
    except grpc.RpcError as exc:
        code = exc.code()
        print(f"effectd probe: {target}: {code.name}", file=sys.stderr)
        # NOT_FOUND: the server is up but does not know the service named.
        return NOT_SERVING if code is grpc.StatusCode.NOT_FOUND else UNREACHABLE
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return SERVING
    print(f"effectd probe: {target}: {status}", file=sys.stderr)
    return NOT_SERVING


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sidecar.probe",
        description="Exit 0 if the effectd daemon's gRPC health says SERVING; 1 "
        "if it answers otherwise (e.g. NOT_SERVING while stopping); 3 if it "
        "cannot be reached in time.",
    )
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        help="unix:PATH, a socket path, or HOST:PORT (e.g. the --health-listen "
        "address); default the daemon's socket ($EFFECTD_SOCKET, else "
        "$EFFECTD_DATA_DIR/effectd.sock)",
    )
    p.add_argument(
        "--service",
        default="",
        help="the health service name to check (default '': the whole server)",
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="give up after this long (default %(default)s)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # A usage error exits 2 (USAGE) from argparse itself.
    args = parser().parse_args(argv)
    target = args.target if args.target is not None else default_target()
    return check(target, service=args.service, timeout=args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
