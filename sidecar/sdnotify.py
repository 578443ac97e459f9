"""The service manager's readiness protocol (sd_notify(3)), without a
library: under systemd with `Type=notify`, `$NOTIFY_SOCKET` names a Unix
datagram socket, and each state is one datagram of `KEY=VALUE` lines:
`READY=1` once the daemon serves (units ordered after it start only then),
`STOPPING=1` as it begins to stop, `STATUS=` a line for `systemctl status`.
Without the variable nothing is sent: the daemon runs the same elsewhere.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

ENV = "NOTIFY_SOCKET"
READY = "READY=1"
STOPPING = "STOPPING=1"

log = logging.getLogger(__name__)


def notify(*states: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Sends `states` (e.g. READY, a `STATUS=...` line) as one datagram to
    the socket `$NOTIFY_SOCKET` names; whether one was sent. A socket that
    does not take it is logged, never raised: the daemon serves on."""
    address = environ.get(ENV, "")
    if not address:
        return False
    if address.startswith("@"):  # Linux's abstract namespace
        address = "\0" + address[1:]
    message = "\n".join(s.replace("\n", " ") for s in states).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message)
    except OSError as exc:
        log.warning("cannot tell the service manager %s: %s", states[0], exc)
        return False
    return True
