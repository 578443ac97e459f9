"""The access rules: which role each RPC needs, and which namespace a
request may touch (contract §3.1, §10.2; reliability-anchors §7).

Pure: no I/O, no gRPC. Default deny: a method missing from `RULES` is
refused to every credential, so a new RPC cannot ship unguarded.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from hashlib import sha256

from sidecar.errors import NotFound, PermissionDenied, Unauthenticated
from sidecar.ledger.model import DEFAULT_NAMESPACE

ALL_NAMESPACES = "*"


class Role(enum.Enum):
    """A token's roles; each RPC names the roles that may call it."""

    AGENT = "agent"
    APPROVER = "approver"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller: a named token, its roles and namespaces."""

    name: str
    roles: frozenset[Role]
    namespaces: frozenset[str]

    @property
    def every_namespace(self) -> bool:
        return ALL_NAMESPACES in self.namespaces

    def namespace(self, requested: str) -> str | None:
        """The namespace a request addressed to `requested` ("" = none named)
        acts in; None when none is named and the token has several (the
        request must say which). A namespace outside the grants answers
        NOT_FOUND, as a missing record would: the answer must not tell
        whether another tenant's records exist (no existence oracle)."""
        if not requested:
            if self.every_namespace:
                return DEFAULT_NAMESPACE
            if len(self.namespaces) == 1:
                return next(iter(self.namespaces))
            return None
        if self.every_namespace or requested in self.namespaces:
            return requested
        raise NotFound("no such record in this namespace")

    def __repr__(self) -> str:
        roles = ",".join(sorted(r.value for r in self.roles))
        return f"Principal({self.name!r}, roles={roles})"


@dataclass(frozen=True, slots=True)
class Rule:
    """Who may call one RPC. `global_scope`: the RPC acts on the whole
    daemon (audit chain, policy, backup), so it needs every namespace."""

    roles: frozenset[Role]
    global_scope: bool = False


def _rule(*roles: Role, global_scope: bool = False) -> Rule:
    return Rule(frozenset(roles), global_scope)


_ANY = (Role.AGENT, Role.APPROVER, Role.OPERATOR)
_AGENT = _rule(Role.AGENT)

# Full gRPC method names. Health is not here: probes carry no credentials and
# it reveals only whether the daemon serves (see `OPEN_METHODS`).
RULES: Mapping[str, Rule] = {
    "/effectd.v1.ToolLedger/PrepareTool": _AGENT,
    "/effectd.v1.ToolLedger/PrepareTools": _AGENT,
    "/effectd.v1.ToolLedger/StartTool": _AGENT,
    "/effectd.v1.ToolLedger/CommitTool": _AGENT,
    "/effectd.v1.ToolLedger/ReportUnknown": _AGENT,
    "/effectd.v1.ToolLedger/Heartbeat": _AGENT,
    "/effectd.v1.ToolLedger/GetToolCall": _rule(*_ANY),
    "/effectd.v1.ToolLedger/ListToolCalls": _rule(*_ANY),
    "/effectd.v1.ToolLedger/DecideApproval": _rule(Role.APPROVER),
    "/effectd.v1.ToolLedger/Reconcile": _rule(Role.OPERATOR),
    # The session stream needs a role that may call one of the RPCs it
    # carries; each message is authorized for its own RPC.
    "/effectd.v1.ToolLedger/Session": _rule(*_ANY),
    # Recover settles expired leases (never executes anything): the agent
    # resuming its run and the operator's `effectd ctl recover` both call it.
    "/effectd.v1.Recovery/Recover": _rule(Role.AGENT, Role.OPERATOR),
    "/effectd.v1.Recovery/AcknowledgeRecovery": _AGENT,
    "/effectd.v1.RetryPolicy/DecideRetry": _AGENT,
    "/effectd.v1.Checkpoints/Get": _AGENT,
    "/effectd.v1.Checkpoints/Put": _AGENT,
    "/effectd.v1.Checkpoints/Delete": _AGENT,
    "/effectd.v1.Checkpoints/Txn": _AGENT,
    "/effectd.v1.Checkpoints/List": _AGENT,
    "/effectd.v1.Provider/ProviderCall": _AGENT,
    "/effectd.v1.Provider/ProviderStream": _AGENT,
    # The audit of one namespace may be read by its operator; with no
    # namespace named, a token of every namespace reads the whole chain and
    # any other token its own namespace (`sidecar.rpc.admin._scope`).
    "/effectd.v1.Admin/ListAudit": _rule(Role.OPERATOR),
    "/effectd.v1.Admin/VerifyAudit": _rule(Role.OPERATOR, global_scope=True),
    "/effectd.v1.Admin/ReloadPolicy": _rule(Role.OPERATOR, global_scope=True),
    "/effectd.v1.Admin/Backup": _rule(Role.OPERATOR, global_scope=True),
    # Scoped like ListAudit: an operator sees the namespaces of its token.
    "/effectd.v1.Admin/GetStats": _rule(Role.OPERATOR),
    # Scoped like GetStats: the calls of the token's namespaces.
    "/effectd.v1.Admin/EnterReconciliation": _rule(Role.OPERATOR),
    # The registrations name hosts and count calls of every namespace.
    "/effectd.v1.Admin/ListDaemons": _rule(Role.OPERATOR, global_scope=True),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": _rule(*_ANY),
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": _rule(*_ANY),
}

OPEN_METHODS = frozenset(
    {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}
)


def authorize(principal: Principal, method: str) -> None:
    """Refuses (PERMISSION_DENIED) a call the principal's roles do not allow;
    an unlisted method is refused to everyone."""
    rule = RULES.get(method)
    if rule is None:
        raise PermissionDenied(f"{method} is not open to any credential")
    if not rule.roles & principal.roles:
        needed = " or ".join(sorted(r.value for r in rule.roles))
        raise PermissionDenied(
            f"{method.rsplit('/', 1)[-1]} needs the {needed} role",
            {"requiredRoles": ",".join(sorted(r.value for r in rule.roles))},
        )
    if rule.global_scope and not principal.every_namespace:
        raise PermissionDenied(
            f"{method.rsplit('/', 1)[-1]} acts on every namespace: it needs a "
            'token granted namespaces = ["*"]'
        )


@dataclass(frozen=True, slots=True)
class Credential:
    """A known token, kept as its SHA-256 digest only."""

    digest: bytes
    principal: Principal


class Credentials:
    """The known tokens. Lookup hashes the presented token and compares it
    with every digest in constant time (CWE-208): the time taken does not
    depend on which token, or how much of one, matched."""

    def __init__(self, credentials: Iterable[Credential]) -> None:
        self._all = tuple(credentials)

    def __len__(self) -> int:
        return len(self._all)

    def digests(self) -> tuple[bytes, ...]:
        """The SHA-256 digests of the tokens, which log redaction masks."""
        return tuple(c.digest for c in self._all)

    def authenticate(self, token: str) -> Principal:
        if not token:
            raise Unauthenticated("the bearer token is empty")
        presented = sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for credential in self._all:
            if hmac.compare_digest(presented, credential.digest):
                found = credential.principal
        if found is None:
            raise Unauthenticated("the bearer token is not known to this daemon")
        return found


BEARER = "bearer "


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The token of the `authorization: Bearer TOKEN` metadata entry;
    refuses a call with none, several, or another scheme."""
    values = [v for k, v in metadata if k == "authorization"]
    if not values:
        raise Unauthenticated(
            "authentication is on: send `authorization: Bearer TOKEN` metadata"
        )
    if len(values) > 1:
        raise Unauthenticated("more than one authorization metadata entry")
    value = values[0]
    if isinstance(value, bytes) or not value.lower().startswith(BEARER):
        raise Unauthenticated("the authorization metadata is not `Bearer TOKEN`")
    return value[len(BEARER) :].strip()
