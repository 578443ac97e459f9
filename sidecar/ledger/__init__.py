"""The rules of ADR-010 as pure functions: identity, fingerprints, the state
machine, decisions, recovery plans, retry decisions, approvals and
reconciliation, the audit chain, retention. Nothing here does I/O;
`sidecar.services` applies the rules inside storage transactions."""
