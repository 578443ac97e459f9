"""Log lines: stable JSON fields, one line per record whatever the input
(CWE-117), and secrets masked as a second line of defence (CWE-532)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar import tracecontext as trace
from sidecar.observability import logs
from sidecar.observability.logs import JsonFormatter, Secrets, TextFormatter
from tests.support.certs import make_pki
from tests.support.processes import ROOT
from tests.support.tokens import ONCALL, write_tokens

# Inputs a client controls that try to end the line and start a forged one.
FORGERIES = [
    'x\n{"level": "info", "msg": "forged"}',
    "x\r\nINFO effectd.access: forged",
    "x\rforged",
    "x\x1b[2Kforged",  # an ANSI escape that erases the line on a terminal
    "x\u2028forged",  # Unicode line separator
    "x\x85forged",  # NEL
    "x\x00\x07\x7fforged",
]


def _record(
    msg: str,
    *args: object,
    extra: dict[str, object] | None = None,
    exc: bool = False,
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError(f"boom {msg}")
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord(
        "effectd.access", logging.INFO, __file__, 1, msg, args, exc_info
    )
    for key, value in (extra or {}).items():
        setattr(record, key, value)
    return record


def assert_one_line(output: str) -> None:
    """The output is exactly one line and nothing on it can pass for the
    start of another record."""
    lines = output.splitlines()  # splits on \r, \x85, \u2028 and more
    assert len(lines) == 1, lines
    assert not any(c in output for c in "\x1b\x00\x07\x7f\r\n\x85\u2028")


def test_json_line_has_the_stable_fields() -> None:
    """A JSON line carries ts (RFC 3339 UTC), level, logger, msg and the
    caller's extra fields under their own names."""
    record = _record(
        "rpc", extra={"method": "/effectd.v1.ToolLedger/PrepareTool", "code": "OK"}
    )
    record.created = 1_796_223_495.123456
    doc = json.loads(JsonFormatter(Secrets()).format(record))
    assert doc == {
        "ts": "2026-12-02T14:58:15.123Z",
        "level": "info",
        "logger": "effectd.access",
        "msg": "rpc",
        "method": "/effectd.v1.ToolLedger/PrepareTool",
        "code": "OK",
    }


def test_json_line_carries_trace_and_traceback() -> None:
    """The RPC's trace-id is added when the caller gave none; a traceback is
    one `exc` string."""
    parent = trace.parse_traceparent(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    )
    token = trace.CURRENT.set(parent)
    try:
        out = JsonFormatter(Secrets()).format(_record("failed", exc=True))
    finally:
        trace.CURRENT.reset(token)
    assert_one_line(out)
    doc = json.loads(out)
    assert doc["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert "Traceback" in doc["exc"]
    assert "ValueError: boom failed" in doc["exc"]


@pytest.mark.parametrize(
    "formatter", [JsonFormatter(Secrets()), TextFormatter(Secrets())]
)
@pytest.mark.parametrize("forgery", FORGERIES)
def test_nothing_a_client_sends_forges_a_line(
    formatter: logging.Formatter, forgery: str
) -> None:
    """In the message, its arguments, an extra field, its name or a traceback,
    control characters and line separators come out escaped: one line."""
    for record in (
        _record(forgery),
        _record("run %s", forgery),
        _record("rpc", extra={"run_id": forgery}),
        _record("rpc", extra={forgery: "x"}),
        _record("failed", exc=True, extra={"note": forgery}),
        _record(forgery, exc=True),
    ):
        out = formatter.format(record)
        assert_one_line(out)
        if isinstance(formatter, JsonFormatter):
            json.loads(out)


def test_negative_control_a_plain_formatter_is_caught() -> None:
    """The one-line check is able to fail: the stock formatter lets a
    newline in a run id start a forged line."""
    out = logging.Formatter("%(levelname)s %(message)s").format(
        _record("run %s", FORGERIES[1])
    )
    with pytest.raises(AssertionError):
        assert_one_line(out)


def test_text_format_escapes_and_quotes() -> None:
    """Text lines escape the backslash too, so a backslash sequence typed in
    the input stays distinct from an escaped control character; values with
    spaces are quoted and unset fields left out."""
    record = _record(
        "path %s", "a\\nb", extra={"reason": "two words", "n": 3, "unset": None}
    )
    record.created = 0.0
    out = TextFormatter(Secrets()).format(record)
    assert out == (
        "1970-01-01T00:00:00.000Z INFO effectd.access: path a\\\\nb "
        'reason="two words" n=3'
    )


# -- redaction ---------------------------------------------------------------

KEY = "sk-provider-key-0123456789"
TOKEN = "tok-7f3c9a1b2d4e6f80-bearer"


@pytest.fixture
def secrets() -> Secrets:
    s = Secrets()
    s.add([KEY, "short"])
    s.add_digests([hashlib.sha256(TOKEN.encode()).digest()])
    return s


@pytest.mark.parametrize(
    "record",
    [
        _record(f"calling with {KEY}"),
        _record("calling with %s", KEY),
        _record("headers %r", {"Authorization": f"Bearer {KEY}"}),
        _record("rpc", extra={"header": f"x-api-key: {KEY}"}),
        _record("rpc", extra={"nested": {"k": [KEY]}}),
        _record("rpc", extra={"raw": KEY.encode()}),
        _record(f"token={TOKEN}"),
        _record("metadata %s", [("authorization", f"Bearer {TOKEN}")]),
        _record("token %s was refused", TOKEN),
        _record("failed", exc=True, extra={"why": KEY}),
        _record(f"{KEY}", exc=True),
    ],
)
@pytest.mark.parametrize("kind", [JsonFormatter, TextFormatter])
def test_registered_secrets_are_masked(
    secrets: Secrets, record: logging.LogRecord, kind: type[JsonFormatter]
) -> None:
    """A provider key or a bearer token (known by its digest only) that
    reaches a log call anyway is printed as ***, wherever it is."""
    out = kind(secrets).format(record)
    assert KEY not in out
    assert TOKEN not in out
    assert logs.MASK in out


def test_unknown_bearer_values_are_masked(secrets: Secrets) -> None:
    """Whatever follows `Bearer ` is masked even if it is no known token."""
    out = JsonFormatter(secrets).format(_record("got Bearer abc.def-123 there"))
    assert json.loads(out)["msg"] == "got Bearer *** there"
    prose = "the bearer token is empty"
    assert json.loads(JsonFormatter(secrets).format(_record(prose)))["msg"] == prose


def test_redaction_leaves_other_text_alone(secrets: Secrets) -> None:
    """Short values are not registered (they would mask words) and text
    without secrets is unchanged."""
    text = "a short note about tok-7f3c9a1b2d4e6f80 and sk-provider"
    assert secrets.redact(text) == text


def test_negative_control_unregistered_secrets_pass() -> None:
    """Without registration nothing is masked: the assertions above test
    the registry, not a formatter that drops everything."""
    out = JsonFormatter(Secrets()).format(_record("calling with %s", KEY))
    assert KEY in out


# -- configure -----------------------------------------------------------------


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, restored after the test."""
    logger = logging.getLogger()
    handlers, level = list(logger.handlers), logger.level
    names = ("httpx", "httpcore", "hpack", "h2", "grpc._cython")
    quiet = {n: logging.getLogger(n).level for n in names}
    yield logger
    for h in list(logger.handlers):
        if h not in handlers:
            logger.removeHandler(h)
    logger.setLevel(level)
    for name, lvl in quiet.items():
        logging.getLogger(name).setLevel(lvl)


def test_configure_installs_one_handler(root: logging.Logger) -> None:
    """configure writes JSON or text at the chosen level; a second call
    replaces the first handler instead of doubling every line."""
    first, second = io.StringIO(), io.StringIO()
    logs.configure("json", "info", stream=first)
    logs.configure("text", "warning", stream=second)
    log = logging.getLogger("effectd.test")
    log.info("dropped")
    log.warning("kept %d", 1)
    assert first.getvalue() == ""
    assert second.getvalue().endswith(" WARNING effectd.test: kept 1\n")
    # Header-logging libraries never log below WARNING, whatever the level.
    logs.configure("json", "debug", stream=second)
    assert logging.getLogger("hpack").level == logging.WARNING
    assert logging.getLogger("httpx").level == logging.WARNING
    assert logging.getLogger("grpc._cython").level == logging.INFO


def test_configure_json_masks_registered_secrets(root: logging.Logger) -> None:
    """The installed handler uses the process-wide registry of add_secrets."""
    out = io.StringIO()
    logs.configure("json", "debug", stream=out)
    logs.add_secrets(["sk-configured-key-99887766"])
    logging.getLogger("effectd.test").debug("key sk-configured-key-99887766")
    assert json.loads(out.getvalue())["msg"] == "key ***"


@pytest.mark.parametrize(("fmt", "level"), [("xml", "info"), ("json", "trace")])
def test_configure_refuses_unknown_settings(
    root: logging.Logger, fmt: str, level: str
) -> None:
    """An unknown format or level names the setting."""
    with pytest.raises(ValueError, match=r"log-format|log-level"):
        logs.configure(fmt, level)


# -- gRPC's own lines ----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "I1203 06:12:13.725265   20115 ssl_transport_security.cc:2563] "
            "Handshake failed with error SSL_ERROR_SSL",
            (
                "grpc.core",
                logging.INFO,
                "Handshake failed with error SSL_ERROR_SSL",
                {"source": "ssl_transport_security.cc:2563"},
            ),
        ),
        (
            "E0101 00:00:00.000001 7 chttp2_server.cc:10] bind failed",
            (
                "grpc.core",
                logging.ERROR,
                "bind failed",
                {"source": "chttp2_server.cc:10"},
            ),
        ),
        (
            "WARNING: All log messages before absl::InitializeLog() is called "
            "are written to STDERR",
            (
                "grpc.core",
                logging.WARNING,
                "All log messages before absl::InitializeLog() is called are "
                "written to STDERR",
                {},
            ),
        ),
        ("something else", ("stderr", logging.WARNING, "something else", {})),
    ],
)
def test_native_lines_are_read_as_records(
    line: str, expected: tuple[str, int, str, dict[str, str]]
) -> None:
    """absl's lines keep their severity and source file; any other native
    line is a warning of `stderr`."""
    assert logs.native_record(line) == expected


def test_grpc_python_loggers_write_through_the_daemons_handler(
    root: logging.Logger,
) -> None:
    """The `grpc` package's Python loggers propagate to the daemon's handler:
    their records are JSON lines like its own."""
    out = io.StringIO()
    logs.configure("json", "info", stream=out)
    logging.getLogger("grpc._cython.cygrpc").warning("from %s", "cython")
    logging.getLogger("grpc.aio._server").error("from aio")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(d["logger"], d["msg"]) for d in lines] == [
        ("grpc._cython.cygrpc", "from cython"),
        ("grpc.aio._server", "from aio"),
    ]


class _Lines:
    """The lines of a stream, read on a thread as they come."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._ended = False
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def until(self, found: Callable[[str], bool], timeout: float = 30) -> str:
        """Reads up to the first line `found` accepts; "" if the stream
        ends or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while not self._ended and (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._ended = True
                break
            self.seen.append(line)
            if found(line):
                return line
        return ""


@pytest.mark.timeout(90)
def test_grpc_core_lines_of_a_daemon_process_are_json(
    short_tmp: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A daemon process with GRPC_VERBOSITY=info and a TLS listener that a
    plaintext client knocks on: gRPC core's lines (its level notice, the
    failed handshake) come out on stderr as the daemon's JSON lines, under
    `grpc.core` with their source (issue 10 item 32: fails before the fix:
    they were absl's own text lines)."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    tokens = write_tokens(short_tmp / "tokens.toml", ONCALL)
    command = [
        *(sys.executable, "-m", "sidecar", "serve"),
        *("--data-dir", str(short_tmp / "data"), "--init", "--listen", "127.0.0.1:0"),
        *("--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)),
        *("--tokens-file", str(tokens)),
    ]
    env = {**os.environ, "GRPC_VERBOSITY": "info"}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    ) as daemon:
        assert daemon.stderr is not None
        lines = _Lines(daemon.stderr)
        try:
            tcp = lines.until(lambda x: "ready on" in x).split(" and ")[-1].strip()
            with grpc.insecure_channel(tcp) as plaintext:
                # Refused at the handshake: the call fails, never answered.
                with pytest.raises(grpc.RpcError):
                    health_pb2_grpc.HealthStub(plaintext).Check(
                        health_pb2.HealthCheckRequest(), timeout=30
                    )
                assert lines.until(lambda x: "Handshake failed" in x)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
    lines.until(lambda _: False)
    ready = [x for x in lines.seen if x.startswith("effectd ") and " ready on " in x]
    assert len(ready) == 1
    records = [json.loads(x) for x in lines.seen if x not in ready]
    core = [r for r in records if r["logger"] == "grpc.core"]
    assert any("Handshake failed" in r["msg"] for r in core), lines.seen
    assert all(r["source"].endswith(tuple("0123456789")) for r in core)
    assert {r["level"] for r in core} >= {"warning", "info"}
    assert records[-1]["msg"] == "shutting down"
