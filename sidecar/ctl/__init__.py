"""`effectd ctl`, the operator's console (contract §10.8): list what needs a
human, inspect, approve, reject, reconcile, put a tool's open calls into
reconciliation, recover, verify and list the audit log, back up while
serving, reload the policy; and, offline, restore a backup
(`sidecar.ctl.restore`). Each command is a module of its own that builds its
parser (`register`) and holds the function that runs it; `sidecar.ctl.parser`
has the options every command shares.

The error boundary, and the exit codes scripts rely on, are
`sidecar.ctl.boundary`; the parser of the global options is
`sidecar.ctl.parser`.
"""

from sidecar.ctl.boundary import run as run
from sidecar.ctl.parser import add_parser as add_parser

__all__ = ["add_parser", "run"]
