"""What operators see of a running daemon: Prometheus metrics
(`metrics`), structured and redacted log lines (`logs`) and spans
(`otel`); the W3C trace context they carry is `sidecar.tracecontext`."""
