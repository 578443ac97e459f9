"""The services: each applies the pure rules of `sidecar.ledger` to stored
records through the `sidecar.storage.api.Store` interface, one write
function per request, so that read, decision and write are one atomic step
and a reply leaves only after its commit."""
