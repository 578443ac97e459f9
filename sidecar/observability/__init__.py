"""What operators see of a running daemon: Prometheus metrics
(`metrics`), structured and redacted log lines (`logs`) and W3C trace
context propagation (`trace`)."""
