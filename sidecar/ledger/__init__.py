"""The rules of ADR-010 as pure functions: identity, fingerprints, the state
machine and the decisions. Nothing here does I/O; `service` applies the rules
inside storage transactions."""
