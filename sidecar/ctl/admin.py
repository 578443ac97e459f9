"""The store views of `effectd ctl`: `stats`, what each namespace holds,
and `daemons`, the daemons that share the store.
"""

from __future__ import annotations

import argparse

from effectd.v1 import admin_pb2 as apb

from sidecar.ctl import args as a
from sidecar.ctl.console import OK, Console
from sidecar.ctl.output import emit_json, enum_name, table, when


def _limit(value: float) -> str:
    return "unlimited" if value == 0 else f"{value:g}"


def stats(con: Console, args: argparse.Namespace) -> int:
    done = con.admin.stats()
    if args.json:
        emit_json(done)
        return OK
    rows = [
        [
            n.namespace,
            n.open_calls,
            n.prepared,
            n.awaiting_approval,
            n.started,
            n.unknown,
            n.stored_bytes,
            n.tombstone_bytes,
        ]
        for n in done.namespaces
    ]
    if rows:
        table(
            (
                "NAMESPACE",
                "OPEN",
                "PREPARED",
                "AWAITING",
                "STARTED",
                "UNKNOWN",
                "BYTES",
                "TOMBSTONE BYTES",
            ),
            rows,
        )
    else:
        print("no namespace holds anything")
    q = done.quotas
    print(
        f"\nquotas per namespace: open calls {_limit(q.open_calls)}, stored bytes "
        f"{_limit(q.stored_bytes)}, requests/s {_limit(q.requests_per_second)}"
        f"; incarnation {done.incarnation}"
    )
    for n in done.namespaces:
        if n.stored_bytes_over_quota:
            print(
                f"over quota: {n.namespace} stores {n.stored_bytes} bytes, "
                f"{n.stored_bytes_over_quota} past its quota: its new calls are "
                "refused (QUOTA_EXCEEDED) until retention frees them"
            )
    if done.HasField("store_fill"):
        fill = done.store_fill
        share = fill.used_bytes / fill.map_size_bytes if fill.map_size_bytes else 0.0
        print(
            f"store: {fill.used_bytes} of {fill.map_size_bytes} bytes used "
            f"({share:.1%}); the data file reaches {fill.high_water_bytes}"
        )
    if done.HasField("data_directory"):
        _print_disk(done)
    if done.HasField("restored"):
        r = done.restored
        print(
            f"restored from {r.backup} at {when(r.restored_at)} by {r.actor} "
            f"(restore {r.restores}, audit entry {r.audit_sequence}): "
            f"{r.made_unknown} calls made UNKNOWN; calls recorded after that "
            "backup are unknown to this store"
        )
    return OK


def _print_disk(done: apb.GetStatsResponse) -> None:
    disk = done.data_directory
    share = disk.free_bytes / disk.total_bytes if disk.total_bytes else 0.0
    where = (
        "it holds the store"
        if disk.holds_store
        else "the store is not on it: watch the database server's disk"
    )
    print(
        f"data directory {disk.path}: {disk.free_bytes} of {disk.total_bytes} "
        f"bytes free ({share:.1%}); {where}"
    )
    fill = done.store_fill
    room = fill.map_size_bytes - fill.high_water_bytes
    if disk.holds_store and done.HasField("store_fill") and room > disk.free_bytes:
        print(
            f"warning: the store may grow {room} more bytes but the disk has "
            f"{disk.free_bytes} free: writes fail with STORAGE_FULL when it is "
            "full; grow the volume, or set --map-size to what it holds"
        )


def daemons(con: Console, args: argparse.Namespace) -> int:
    done = con.admin.daemons()
    if args.json:
        emit_json(done)
        return OK
    rows = [
        [
            ("* " if d.answering else "") + d.daemon_id,
            d.incarnation,
            enum_name(apb.DaemonStanding.Name(d.standing), "DAEMON_STANDING_").lower(),
            when(d.registered_at),
            when(d.renewed_at),
            when(d.expires_at),
            when(d.ended_at),
            d.started_calls,
        ]
        for d in done.daemons
    ]
    table(
        (
            "DAEMON",
            "INCARNATION",
            "STANDING",
            "REGISTERED",
            "RENEWED",
            "LEASE END",
            "ENDED",
            "STARTED CALLS",
        ),
        rows,
    )
    kind = "shared by several daemons" if done.shared else "this daemon's alone"
    print(
        f"\n* answers (incarnation {done.incarnation}); the store is {kind}; "
        f"read at {when(done.read_at)}"
    )
    return OK


def register(cmds: a.Subparsers) -> None:
    """`stats` and `daemons`: what the store holds, and who serves it."""
    a.command(
        cmds,
        "stats",
        stats,
        help="what each namespace holds: open calls by state, bytes, quotas",
        description="Per namespace (or the one of --namespace): calls not yet "
        "committed, by state (AWAITING and UNKNOWN wait for a person), and the "
        "bytes stored, against the quotas in force.",
    )
    a.command(
        cmds,
        "daemons",
        daemons,
        help="the daemons sharing the store: registrations, standing, calls held",
        description="Every registration the store keeps, oldest first: the "
        "daemon id, its incarnation, whether it is live, lapsed (its daemon "
        "died or lost the store), ended (a clean stop) or superseded (a "
        "restart), when it registered, last renewed and lapses unless renewed, "
        "and the STARTED calls whose lease it granted (those its lapse settles "
        "to UNKNOWN). `*` marks the daemon that answers.",
    )
