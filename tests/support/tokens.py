"""The bearer tokens the tests authenticate with, defined once.

Each set is what one kind of test needs: the gate's role table
(`GATE`), an agent and an on-call operator for the ctl and client tests
(`TEAM`), one agent whose secret must never be logged (`OBSERVED`). A test
gives `tokens_text(...)` to `ServeConfig(tokens_text=...)`, or writes a
tokens file with `write_tokens` for `--tokens-file`. Secrets are made up and
at least 16 characters; each names its holder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Token:
    """One `[[token]]` table of a tokens file."""

    name: str
    secret: str
    roles: tuple[str, ...]
    namespaces: tuple[str, ...]

    def toml(self) -> str:
        # JSON strings and arrays of strings are valid TOML.
        return (
            "[[token]]\n"
            f"name = {json.dumps(self.name)}\n"
            f"secret = {json.dumps(self.secret)}\n"
            f"roles = {json.dumps(list(self.roles))}\n"
            f"namespaces = {json.dumps(list(self.namespaces))}\n"
        )


def tokens_text(*tokens: Token) -> str:
    """A tokens file's text holding `tokens`."""
    return "\n".join(token.toml() for token in tokens)


def write_tokens(path: Path, *tokens: Token, mode: int = 0o600) -> Path:
    """Writes a tokens file (0600: the daemon refuses one others may read)."""
    path.write_text(tokens_text(*tokens))
    path.chmod(mode)
    return path


# -- the gate's role table (tests/auth) ---------------------------------------

AGENT_A = Token("agent-a", "agent-a-secret-0123456789", ("agent",), ("a",))
AGENT_B = Token("agent-b", "agent-b-secret-0123456789", ("agent",), ("b",))
APPROVER_A = Token("approver-a", "approver-a-secret-0123456789", ("approver",), ("a",))
OPERATOR_A = Token("operator-a", "operator-a-secret-0123456789", ("operator",), ("a",))
OPERATOR_ALL = Token(
    "operator-all", "operator-all-secret-0123456789", ("operator", "approver"), ("*",)
)
AGENT_AB = Token("agent-ab", "agent-ab-secret-0123456789", ("agent",), ("a", "b"))
GATE = (AGENT_A, AGENT_B, APPROVER_A, OPERATOR_A, OPERATOR_ALL, AGENT_AB)

# -- an agent of one team and the on-call operator (ctl and client tests) ------

TEAM_AGENT = Token("agent-a", "agent-token-0123456789abcdef", ("agent",), ("team-a",))
ONCALL = Token(
    "oncall",
    "operator-token-0123456789abcdef",
    ("agent", "approver", "operator"),
    ("*",),
)
TEAM = (TEAM_AGENT, ONCALL)

# -- one agent whose secret the logs and spans must never hold -----------------

OBSERVED_AGENT = Token(
    "agent-a", "tok-agent-a-5d41402abc4b2a76b9719d91", ("agent",), ("ns-a",)
)
OBSERVED = (OBSERVED_AGENT,)
#: A well-formed secret that no tokens file holds.
UNKNOWN_SECRET = "tok-nobody-7c6a180b36896a0a8c02787e"

# -- the web console's people (tests/web) ---------------------------------------

CONSOLE_AGENT = Token(
    "agent-c", "console-agent-token-0123456789", ("agent",), ("team-c",)
)
APPROVER_ANA = Token(
    "ana", "console-ana-token-0123456789ab", ("approver",), ("team-c",)
)
APPROVER_BEN = Token(
    "ben", "console-ben-token-0123456789ab", ("approver",), ("team-c",)
)
# On call: reconciles and reads (and verifies) the whole audit log.
ONCALL_OLA = Token("ola", "console-ola-token-0123456789ab", ("operator",), ("*",))
# May read the queue of team-c but not decide anything.
VIEWER_VIC = Token("vic", "console-vic-token-0123456789ab", ("agent",), ("team-c",))
CONSOLE = (CONSOLE_AGENT, APPROVER_ANA, APPROVER_BEN, ONCALL_OLA, VIEWER_VIC)
