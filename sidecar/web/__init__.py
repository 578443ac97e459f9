"""`effectd console`: the people's side of effectd, a small web application
for approvers and on-call operators (issue 16, docs/console.md).

A client of the daemon's gRPC API only, like `effectd ctl`: a person signs in
with their effectd token, every page is read through the same RPCs, and
every decision is the same RPC `effectd ctl` sends, with the same revision
compare-and-swap. It serves on a loopback address; any other address needs
TLS (`--tls-cert`, `--tls-key`), the same rule as the daemon's TCP listener,
and then only sessions signed in with a token.

The server is `sidecar.web.server`, the command line `sidecar.web.command`,
the pages `sidecar.web.app` (routes), `pages` and `callpage`.
"""

from sidecar.web.command import add_parser as add_parser
from sidecar.web.command import run as run
from sidecar.web.server import ConsoleConfig as ConsoleConfig
from sidecar.web.server import ConsoleServer as ConsoleServer

__all__ = ["ConsoleConfig", "ConsoleServer", "add_parser", "run"]
