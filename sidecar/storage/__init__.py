"""Durable storage behind a narrow interface (`api`), implemented on LMDB.

The ledger and the checkpoint store see only `api.Store`: read views, and
write functions that a single writer applies in group-committed
transactions. A shared PostgreSQL backend implements the same protocol.
"""
