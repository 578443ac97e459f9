"""How a prepare is decided and saved in a write function: the lease it
asks for, the fingerprint scheme of the stored call it is compared with, and
one prepare of a batch (`LedgerService.prepare_many`), within its
namespace's quotas."""

from __future__ import annotations

import dataclasses

from sidecar.errors import EffectdError
from sidecar.ledger import fingerprint, quota, retention, rules
from sidecar.ledger.model import FINGERPRINT_V2
from sidecar.ledger.policy import Policy
from sidecar.ledger.quota import Quotas
from sidecar.ledger.rules import Answer, Now, PrepareSpec
from sidecar.storage.api import LedgerWrites


def with_lease(spec: PrepareSpec, policy: Policy) -> PrepareSpec:
    """`spec` with the policy's default lease when it asks for none."""
    if spec.lease_ms:
        return spec
    return dataclasses.replace(spec, lease_ms=policy.default_lease_ms)


def prepare_one(
    view: LedgerWrites, spec: PrepareSpec, now: Now, policy: Policy, quotas: Quotas
) -> Answer | EffectdError:
    """The answer of one prepare.

    Raises:
        QuotaExceeded: the prepare would create a record past the namespace's
            open-call or stored-byte quota; raised (not returned), so the
            write function leaves nothing behind. A repeated prepare of an
            existing record is always answered.
    """
    old, tomb = view.find_call(spec.ref)
    if old is None:
        if tomb is not None:
            # contract §4.7: the tombstone still refuses a re-execution.
            return retention.duplicate_prepare(
                tomb, in_scheme(spec, tomb.fingerprint_scheme)
            )
    else:
        spec = in_scheme(spec, old.fingerprint_scheme)
    step = rules.prepare(old, spec, now, policy)
    if old is None and not quotas.limits_storage:
        view.write_call(old, step.call)
    elif old is None:
        namespace = spec.ref.namespace
        before = view.usage(namespace)
        view.write_call(old, step.call)
        # Measured after the save: the stored size is the encoded record's.
        refusal = quota.refuse_growth(namespace, before, view.usage(namespace), quotas)
        if refusal is not None:
            raise refusal
    elif step.call.revision != old.revision:
        view.write_call(old, step.call)
    return step.reply


def in_scheme(spec: PrepareSpec, scheme: int) -> PrepareSpec:
    """`spec` with its input fingerprinted in `scheme`, to be compared with a
    stored call whose fingerprint is of that scheme (one stored before the
    input's kind was hashed keeps comparing with inputs of its own kind)."""
    if scheme == FINGERPRINT_V2:
        return spec
    return dataclasses.replace(spec, fingerprint=fingerprint.of(spec.input, scheme))
