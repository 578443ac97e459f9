"""Who is calling, resolved once per call (contract §10.2).

The boundary (`sidecar.rpc.boundary`) resolves each call's caller once, from
the authenticated principal and the parsed request, into a frozen `Caller`:
the principal (None without authentication), the namespace the request acts
in, and whom the call is charged to. The servicers read it with `current()`
and hand it to the translation layer (`sidecar.rpc.convert`), which reads
each namespace a request names against it; nothing below the boundary looks
at the credential again. With authentication on, the namespace comes from
the credential, never from the request body alone.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from sidecar.auth.access import Principal
from sidecar.errors import NotFound
from sidecar.ledger import quota
from sidecar.ledger.validation import Violations


@dataclass(frozen=True, slots=True)
class Caller:
    """The caller of one call, as the boundary resolved it."""

    principal: Principal | None
    # The valid namespace the request acts in, for the record; "" when it
    # names none the caller may act in (the handler refuses it).
    namespace: str
    # The rate-limit bucket and concurrency share the call counts against.
    charged: quota.Caller
    # The namespace the request named, which `namespace` was resolved from
    # (None: not resolved from a request).
    requested: str | None = None

    @property
    def whole_daemon(self) -> bool:
        """Whether the caller may act on every namespace (no authentication,
        or a token granted them all)."""
        return self.principal is None or self.principal.every_namespace

    @property
    def visible(self) -> frozenset[str] | None:
        """The namespaces the caller may see: None (every one) without
        authentication or for a token granted them all, else its grants."""
        if self.principal is None or self.principal.every_namespace:
            return None
        return self.principal.namespaces

    def actor(self, default: str) -> str:
        """Who a change is recorded as: the token's name with authentication
        on, else `default`."""
        return default if self.principal is None else self.principal.name

    def operator(self, v: Violations, field_path: str, named: str) -> str:
        """Who an operator action is recorded as: the name the request gives,
        or with authentication on the token's name (a request may repeat it,
        never name someone else)."""
        if self.principal is None:
            return named
        if named and named != self.principal.name:
            v.add(field_path, "must be empty or the name of the caller's token")
        return self.principal.name

    def place(self, v: Violations, field_path: str, requested: str) -> str:
        """The namespace a request field acts in (see `place`). The one the
        boundary resolved already is not resolved again: the answer depends
        only on the principal and the name, and only a valid one is kept."""
        if self.namespace and requested == self.requested:
            return self.namespace
        return place(self.principal, v, field_path, requested)


def place(
    principal: Principal | None, v: Violations, field_path: str, requested: str
) -> str:
    """The namespace a request addressed to `requested` acts in. Without
    authentication: the one it names (validated), default `default`. With
    authentication: the credential decides (`Principal.namespace`); one
    outside its grants answers NOT_FOUND."""
    before = len(v.items)
    named = v.namespace(field_path, requested)
    if principal is None or len(v.items) > before:
        return named
    chosen = principal.namespace(requested)
    if chosen is None:
        v.add(field_path, "is required: this token may touch several namespaces")
        return named
    return chosen


def resolve(principal: Principal | None, request: object) -> Caller:
    """The caller of a call by `principal` (None: no authentication) that
    asks `request`; the boundary calls it once per call."""
    requested = requested_namespace(request)
    acting = _acting_in(principal, requested)
    return Caller(principal, acting, _charged(principal, acting), requested)


def _charged(principal: Principal | None, acting: str) -> quota.Caller:
    """`charged`, given the namespace the call acts in (`_acting_in`)."""
    if principal is not None:
        if len(principal.namespaces) == 1 and not principal.every_namespace:
            return quota.Caller(namespace=next(iter(principal.namespaces)))
        return quota.Caller(token=principal.name)
    return quota.Caller(namespace=acting)


def charged(principal: Principal | None, requested: str) -> quota.Caller:
    """Whom a call is charged to. With authentication, its caller: the
    namespace of a token bound to one, else the token itself; never a
    namespace the request names, which may be one the token is refused
    (several namespaces or made-up ones must not widen a token's limit).
    Without it, the namespace the request names once it is valid (empty:
    the default one); requests naming an invalid one share one bucket."""
    return _charged(
        principal, "" if principal is not None else _acting_in(None, requested)
    )


def _acting_in(principal: Principal | None, requested: str) -> str:
    """The valid namespace the call acts in, for the record; "" when none
    (the handler refuses it)."""
    v = Violations()
    try:
        acting = place(principal, v, "namespace", requested)
    except NotFound:
        return ""
    return "" if v.items else acting


def requested_namespace(request: object) -> str:
    """The namespace a request names: its `namespace` field, that of its
    `ref` or `call`, or that of its first call for a batch; "" for none."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None:
        return ""
    fields = descriptor.fields_by_name
    if "namespace" in fields:
        return str(request.namespace)  # type: ignore[attr-defined]
    for name in ("ref", "call"):
        if name in fields and fields[name].message_type is not None:
            return str(getattr(request, name).namespace)
    if "calls" in fields and request.calls:  # type: ignore[attr-defined]
        return str(request.calls[0].ref.namespace)  # type: ignore[attr-defined]
    return ""


# Set by the boundary in the task that serves the call, for its handler.
CURRENT: ContextVar[Caller] = ContextVar("effectd_caller")


def current() -> Caller:
    """The caller of the call being served, as the boundary resolved it.

    Raises:
        LookupError: outside a call the boundary serves (a servicer run
            without the gate would otherwise act unauthenticated).
    """
    return CURRENT.get()
