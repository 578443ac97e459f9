"""The public names of the observability modules, pinned: the gate, the
server and the CLI call them."""

from __future__ import annotations

from types import ModuleType

import pytest

from sidecar import tracecontext as trace
from sidecar.observability import collectors, logs, metrics, native, process


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            metrics,
            "BATCH_BUCKETS COMMIT_BUCKETS Metrics MetricsServer OTHER RPC_BUCKETS "
            "serve_metrics served_methods",
        ),
        (
            collectors,
            "CountsEntries DiskCollector LedgerCollector ProviderCollector "
            "ProviderSource "
            "count_states",
        ),
        (
            logs,
            "JsonFormatter MASK MIN_SECRET_LENGTH NativeStderr Secrets "
            "TextFormatter add_secret_digests add_secrets configure escape fields "
            "native_record rfc3339",
        ),
        (native, "NativeStderr native_record"),
        (process, "STATUS ResidentMemoryCollector resident_memory"),
        (
            trace,
            "CURRENT TRACEPARENT TRACESTATE TraceParent current from_metadata "
            "parse_traceparent",
        ),
    ],
)
def test_public_names_are_pinned(module: ModuleType, names: str) -> None:
    """Each module exports exactly these names, and each exists."""
    assert sorted(module.__all__) == sorted(names.split())
    for name in module.__all__:
        assert hasattr(module, name)
