"""`effectd ctl`'s error boundary: it runs the parsed command and turns
what can go wrong into the exit codes scripts rely on (0 ok, 1 refused by the
daemon with its ErrorInfo reason, UNAUTHENTICATED and PERMISSION_DENIED
included, 2 usage, a bad --token-file or TLS file among them, 3 daemon not
reachable, 4 audit verification failed, 5 the TLS handshake failed: a
certificate not trusted, TLS on one side only, or a client certificate missing
or refused).
"""

from __future__ import annotations

import argparse
import sys

import grpc

from effectd_client import EffectdError
from sidecar.ctl.args import Run
from sidecar.ctl.console import Console
from sidecar.ctl.credentials import UsageError, connection
from sidecar.ctl.output import emit_json
from sidecar.ctl.parser import default_target
from sidecar.ctl.restore import run as offline_restore

REFUSED = 1
USAGE = 2
UNREACHABLE = 3
HANDSHAKE_FAILED = 5

# What an operator does about a refusal of the credential itself.
_HINTS = {
    "UNAUTHENTICATED": "the daemon requires a bearer token: pass --token-file FILE "
    "or set EFFECTD_TOKEN to a token from its tokens file",
    "PERMISSION_DENIED": "the token is valid but its roles do not allow this "
    "command (approve and reject need the approver role; reconcile and policy "
    "need operator)",
}


def _hint(exc: EffectdError) -> str:
    if exc.reason == "RECONCILE_QUARANTINE":
        attempt = exc.metadata.get("attempt", "N")
        return (
            "its holder may still be running: wait, or if you know that attempt "
            f"{attempt} is dead (its process is gone), run the command again "
            f"with --confirm-dead-attempt {attempt}"
        )
    return _HINTS.get(exc.reason, "")


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


# What gRPC's UNAVAILABLE says of a failed TLS handshake, and the fix.
_TLS_ERRORS = (
    (
        "WRONG_VERSION_NUMBER",
        "the daemon at {target} does not serve TLS there: leave out --tls-ca, "
        "--tls-cert and --tls-key",
    ),
    (
        "CERTIFICATE_VERIFY_FAILED",
        "the daemon's certificate is not trusted: --tls-ca must name the CA "
        "that signed it, and the certificate must name the host of {target}",
    ),
)


def _handshake_failure(
    exc: EffectdError, target: str, args: argparse.Namespace
) -> str | None:
    """What went wrong in the TLS handshake, and the fix; None when the
    channel failed for another reason. gRPC reports a handshake only in the
    text of its UNAVAILABLE, so the text is what is read here."""
    text = exc.message
    for marker, why in _TLS_ERRORS:
        if marker in text:
            return why.format(target=target)
    if "handshake failed" in text.lower() or "TSI_" in text:
        return f"the TLS handshake failed ({text})"
    # The daemon hangs up at once on a TCP connection that does not complete
    # its TLS handshake: a plaintext client, or a client certificate missing
    # or signed by a CA it does not trust. A Unix socket is never TLS.
    if "Socket closed" not in text or target.startswith("unix:"):
        return None
    return _closed_in_handshake(args)


def _closed_in_handshake(args: argparse.Namespace) -> str:
    if args.tls_ca is None:
        return (
            "the daemon closed the connection during the handshake: it "
            "probably serves TLS; pass --tls-ca FILE (the CA of its certificate)"
        )
    if args.tls_cert is None:
        return (
            "the daemon closed the TLS handshake: it probably requires a client "
            "certificate; pass --tls-cert FILE and --tls-key FILE"
        )
    return (
        "the daemon refused the client certificate in the TLS handshake: it "
        "must be signed by the CA the daemon trusts (its --tls-client-ca)"
    )


def run(args: argparse.Namespace) -> int:
    """Runs the parsed `effectd ctl` command; returns its exit code."""
    if args.ctl_command == "restore":
        # Offline: no daemon may run on the data directory.
        return offline_restore(args)
    target = _target(args)
    try:
        console = Console(connection(target, args), args.namespace, args.timeout)
    except UsageError as exc:
        print(f"effectd ctl: {exc}", file=sys.stderr)
        return USAGE
    try:
        command: Run = args.handler
        return command(console, args)
    except EffectdError as exc:
        handshake = _handshake_failure(exc, target, args) if _unreachable(exc) else None
        if handshake is not None:
            print(
                f"effectd ctl: no TLS connection to {target}: {handshake}.",
                file=sys.stderr,
            )
            return HANDSHAKE_FAILED
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
                        "metadata": dict(exc.metadata),
                        "violations": [
                            {"field": v.field, "description": v.description}
                            for v in exc.violations
                        ],
                    }
                }
            )
        print(
            f"effectd ctl: refused: {exc.reason or exc.code.name}: {exc.message}",
            file=sys.stderr,
        )
        hint = _hint(exc)
        if hint:
            print(f"  {hint}", file=sys.stderr)
        for v in exc.violations:
            print(f"  {v.field}: {v.description}", file=sys.stderr)
        return REFUSED
    finally:
        console.close()
