"""Durable storage behind a narrow interface (`api`), with two backends.

The ledger and the checkpoint store see only `api.Store`: read views, and
write functions that a store applies in group-committed transactions. The
backends are packages beside the backend-neutral part (`api`, the record
codecs, keys, usage counters, tombstones, daemons, restore marking, long
reads): `lmdb` (one daemon's embedded store) and `postgres` (a ledger shared
by many daemons); `backends` is the registry that maps a `--store` URL to
one of them.
"""
