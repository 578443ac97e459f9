"""Who may call what: bearer tokens, roles and the namespaces they reach.

`tokens` loads the credentials (a 0600 TOML file or the environment);
`access` holds the rules (which role each RPC needs, which namespace a
request may touch). The gRPC boundary applies them in `sidecar.rpc.gate`.
"""
