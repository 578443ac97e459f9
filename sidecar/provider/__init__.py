"""Outbound provider HTTP calls and their retry policy (DESIGN §9).

`routes` (the only reachable upstreams), `policy` (the pure retry rules),
`budget` (the host-wide retry budget), `sse` (server-sent events), and
`client` (the HTTP side that applies them with one shared httpx client).
"""
