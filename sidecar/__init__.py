"""effectd: the durable tool-call ledger and retry authority of ADR-010.

The daemon records, decides and answers; it never executes a tool itself.
`sidecar.ledger` holds the rules, `sidecar.storage` the LMDB store,
`sidecar.rpc` the gRPC boundary, `sidecar.composition` the wiring and
`sidecar.server` the lifecycle.
"""

__version__ = "0.1.0"
