"""`effectd ctl`, the operator's console (DESIGN §10): list what needs a
human, inspect, approve, reject, reconcile, recover, verify and list the
audit log, back up while serving, reload the policy.

This module is the console's error boundary: it turns what can go wrong into
the exit codes scripts rely on (0 ok, 1 refused by the daemon with its
ErrorInfo reason, UNAUTHENTICATED and PERMISSION_DENIED included, 2 usage,
a bad --token-file or TLS file among them, 3 daemon not reachable, 4 audit
verification failed).
"""

from __future__ import annotations

import argparse
import sys

import grpc

from effectd_client import EffectdError
from sidecar.ctl.commands import Console, command_of
from sidecar.ctl.credentials import UsageError, connection
from sidecar.ctl.output import emit_json
from sidecar.ctl.parser import add_parser as add_parser
from sidecar.ctl.parser import default_target

REFUSED = 1
USAGE = 2
UNREACHABLE = 3

# What an operator does about a refusal of the credential itself.
_HINTS = {
    "UNAUTHENTICATED": "the daemon requires a bearer token: pass --token-file FILE "
    "or set EFFECTD_TOKEN to a token from its tokens file",
    "PERMISSION_DENIED": "the token is valid but its roles do not allow this "
    "command (approve and reject need the approver role; reconcile and policy "
    "need operator)",
}


def _target(args: argparse.Namespace) -> str:
    if args.target:
        return str(args.target)
    if args.socket is not None:
        return f"unix:{args.socket}"
    return default_target()


def _unreachable(exc: EffectdError) -> bool:
    # A refusal always carries an ErrorInfo reason; a bare UNAVAILABLE or
    # deadline comes from the channel, not from effectd.
    return not exc.reason and exc.code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def run(args: argparse.Namespace) -> int:
    """Runs the parsed `effectd ctl` command; returns its exit code."""
    target = _target(args)
    try:
        console = Console(connection(target, args), args.namespace, args.timeout)
    except UsageError as exc:
        print(f"effectd ctl: {exc}", file=sys.stderr)
        return USAGE
    try:
        return command_of(args)(console, args)
    except EffectdError as exc:
        if _unreachable(exc):
            print(
                f"effectd ctl: the daemon is not reachable at {target} "
                f"({exc.code.name.lower()}: {exc.message}). Is it running? Start "
                "one with `make run`, or point --socket / --target at it.",
                file=sys.stderr,
            )
            return UNREACHABLE
        if args.json:
            emit_json(
                {
                    "error": {
                        "code": exc.code.name,
                        "reason": exc.reason,
                        "message": exc.message,
                        "metadata": exc.metadata,
                        "violations": list(exc.violations),
                    }
                }
            )
        print(
            f"effectd ctl: refused: {exc.reason or exc.code.name}: {exc.message}",
            file=sys.stderr,
        )
        hint = _HINTS.get(exc.reason)
        if hint:
            print(f"  {hint}", file=sys.stderr)
        for v in exc.violations:
            print(f"  {v.field}: {v.description}", file=sys.stderr)
        return REFUSED
    finally:
        console.close()
