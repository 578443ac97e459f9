"""Outbound provider HTTP calls and their retry policy (contract §9).

In reading order: `routes` (the only reachable upstreams), `policy` (the
pure retry rules), `budget` (the host-wide retry budget), `sse`
(server-sent events), `messages` (the values in and out), `prepare` (a
request checked and made ready once), `observer` (what a call reports),
`attempts` (the retry loop), `unary` and `stream` (the two ways to read an
answer), and `client` (the entry point, over one shared httpx client).
"""
