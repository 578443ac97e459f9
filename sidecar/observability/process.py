"""The daemon process's resident memory, split the way the kernel counts it.

LMDB maps its data file into the daemon's address space, so every page of
the ledger that was read counts in the resident set size: a store that is
read a lot looks like a memory leak to an alert on the total. The kernel
keeps the parts apart (Linux `/proc/self/status`): `RssAnon` is the memory
the process allocated itself (the heap, where a leak would show), `RssFile`
the pages of mapped files (the LMDB data file, shared libraries), which the
kernel can drop and read again, and `RssShmem` shared memory. This module
exports them as `effectd_process_resident_memory_bytes{kind}`, read at each
scrape; where there is no such file (not Linux) it exports nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

STATUS = Path("/proc/self/status")
# The fields of /proc/PID/status, in kB, and the label of each.
_KINDS = {"RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}


def resident_memory(status: str) -> dict[str, int]:
    """Bytes by kind ("anon", "file", "shmem") in the text of
    `/proc/PID/status`; a field it lacks is absent."""
    found: dict[str, int] = {}
    for line in status.splitlines():
        name, _, value = line.partition(":")
        kind = _KINDS.get(name)
        parts = value.split()
        if kind is not None and len(parts) == 2 and parts[1] == "kB":
            found[kind] = int(parts[0]) * 1024
    return found


class ResidentMemoryCollector(Collector):
    """`effectd_process_resident_memory_bytes{kind}` from `status`."""

    def __init__(self, status: Path = STATUS) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        try:
            kinds = resident_memory(self._status.read_text())
        except (OSError, ValueError):
            return
        if not kinds:
            return
        family = GaugeMetricFamily(
            "effectd_process_resident_memory_bytes",
            "Resident memory by kind: anon (allocated by the process: a leak "
            "shows here), file (mapped files: the LMDB data file, libraries), "
            "shmem. Their sum is process_resident_memory_bytes.",
            labels=("kind",),
        )
        for kind, value in sorted(kinds.items()):
            family.add_metric((kind,), value)
        yield family


__all__ = ["STATUS", "ResidentMemoryCollector", "resident_memory"]
