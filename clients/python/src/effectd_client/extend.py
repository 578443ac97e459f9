"""What a framework adapter may use beyond `effectd_client`'s public names.

An adapter (a package of `effectd_client.contrib`) is written against the
public client: `Client`, `AsyncClient`, `Run`, `AsyncRun`, the values and the
exception tree of `effectd_client`, the rules of `effectd_client.policy`. A
few pieces of the safe call's machinery are needed by every adapter that
drives the ledger itself rather than through `Run.tool`; they are named here,
and only here, so that the client's private modules stay free to change:

- outcomes: `is_unknown(exc, unknown_on, definite_on)`, whether a tool's
  exception leaves its effect unknown (the rules of docs/safe-call.md), and
  `Matcher`, an exception class or predicate of `unknown_on`/`definite_on`;
- the safe call's judgement of a prepare's answer: `admit(prepared,
  retry_unknown=...)` returns the `Next` step (run, replay, start, retry) or
  raises the refusal the safe call raises; `asks_for_retry(exc)` says whether
  an `InvalidTransition` refused a start only because the last outcome is
  unknown and no retry was asked for;
- the operator's MCP policy: `McpPolicy` (by server and tool, from TOML),
  its `McpServerPolicy` rows and the `McpDecision` it answers, for every
  adapter that puts MCP tools through the ledger.

`tests/repository/test_layers.py` fails when a module of `effectd_client.contrib`
imports a private module of the client (`effectd_client._*`) or another
adapter's package; a name an adapter needs is added here, with a line above.
"""

from effectd_client._mcp_policy import McpDecision, McpPolicy, McpServerPolicy
from effectd_client._safe_base import Next, admit, asks_for_retry
from effectd_client._safe_outcomes import Matcher, is_unknown

__all__ = [
    "Matcher",
    "McpDecision",
    "McpPolicy",
    "McpServerPolicy",
    "Next",
    "admit",
    "asks_for_retry",
    "is_unknown",
]
