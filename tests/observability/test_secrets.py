"""Nothing secret reaches the logs: bearer tokens (right and wrong ones),
provider API keys and tool payloads, captured in process (every record,
every field) and from a daemon run as its own process (its stderr)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import grpc
import pytest
from effectd.v1 import provider_pb2 as pb
from effectd.v1 import provider_pb2_grpc

from effectd_client import Client
from effectd_client import EffectdError as ClientError
from sidecar.observability.logs import Secrets, fields
from tests.observability.support import API_KEY, observed_daemon
from tests.provider.upstream import Reply, serving
from tests.support.processes import daemon_process
from tests.support.tokens import (
    OBSERVED,
    OBSERVED_AGENT,
    UNKNOWN_SECRET,
    tokens_text,
    write_tokens,
)

TOKEN, WRONG = OBSERVED_AGENT.secret, UNKNOWN_SECRET
MARKER = "PAYLOAD-MARKER-e3b0c442"
TOKENS = tokens_text(*OBSERVED)
SECRETS = (TOKEN, WRONG, API_KEY, MARKER)


def assert_clean(text: str, secrets: Iterable[str] = SECRETS) -> None:
    """None of `secrets` occurs in `text`."""
    found = [s for s in secrets if s in text]
    assert not found, f"secrets in the logs: {found}"


def _rendered(records: Iterable[logging.LogRecord]) -> str:
    """Every record with every field, unmasked: what any handler could print."""
    return "\n".join(
        json.dumps(fields(r, Secrets()), default=str) + " " + repr(r.args)
        for r in records
    )


def _exercise(target: str) -> None:
    """Prepares, commits, a refused prepare, checkpoints, a provider call,
    with the token; then calls with a wrong token and with none."""
    with Client(target, token=TOKEN) as client:
        first = client.prepare_tool("run", "call", "send", {"body": MARKER}, start=True)
        client.commit_tool("run", "call", first.call.attempt, {"echo": MARKER})
        with pytest.raises(ClientError):
            client.prepare_tool("run", "call", "send", {"body": MARKER + "!"})
        client.put_checkpoint("cp", MARKER.encode())
        list(client.list_tool_calls(run_id="run"))
    with grpc.insecure_channel(target) as channel:
        answer = provider_pb2_grpc.ProviderStub(channel).ProviderCall(
            pb.ProviderRequest(
                route="up",
                path="/v1/chat",
                body=MARKER.encode(),
                headers=[pb.Header(name="x-note", value=MARKER)],
            ),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=30,
        )
        assert answer.status == 200
    for token in (WRONG, ""):
        with Client(target, token=token) as client, pytest.raises(ClientError):
            client.prepare_tool("run", "other", "send", {"body": MARKER})


def test_in_process_logs_hold_no_secret(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every record logged while tokens, a provider key and payloads pass
    through the daemon (a retried provider call included) is free of them."""
    caplog.set_level(logging.DEBUG)
    script = (Reply(503, body=MARKER.encode()), Reply(200, body=MARKER.encode()))
    with observed_daemon(short_tmp, *script, tokens_text=TOKENS) as (running, up):
        _exercise(running.target)
        assert {s.headers["authorization"] for s in up.seen} == {f"Bearer {API_KEY}"}
    records = list(caplog.records)
    # The capture is not empty: access lines and the retry were logged.
    access = [r for r in records if r.name == "effectd.access"]
    assert any(getattr(r, "code", "") == "UNAUTHENTICATED" for r in access)
    assert any("PrepareTool" in str(getattr(r, "method", "")) for r in access)
    assert any(getattr(r, "event", "") == "retry_scheduled" for r in records)
    assert_clean(_rendered(records))
    assert_clean(caplog.text)


def test_negative_control_a_leaky_log_call_is_caught(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check can fail: a log call that prints the token, in its message
    or in an extra field, is caught by the same helper."""
    caplog.set_level(logging.INFO)
    logging.getLogger("effectd.leaky").info("sent %s", TOKEN)
    logging.getLogger("effectd.leaky").info("call", extra={"input": MARKER})
    with pytest.raises(AssertionError, match="secrets in the logs"):
        assert_clean(caplog.text)
    with pytest.raises(AssertionError, match="secrets in the logs"):
        assert_clean(_rendered(caplog.records[1:]))


@pytest.mark.slow
def test_daemon_process_stderr_holds_no_secret(short_tmp: Path) -> None:
    """The daemon as its own process, JSON logs at debug level: its whole
    output is free of secrets, and each log line is one JSON object."""
    tokens = write_tokens(short_tmp / "tokens.toml", *OBSERVED)
    (short_tmp / "key").write_text(API_KEY)
    with serving(Reply(200, body=MARKER.encode())) as up:
        providers = short_tmp / "providers.toml"
        providers.write_text(
            f'[routes.up]\nbase_url = "{up.base_url}"\n'
            f'credential_file = "{short_tmp / "key"}"\npaths = ["/v1/"]\n'
        )
        args = (
            *("--tokens-file", str(tokens), "--providers", str(providers)),
            *("--log-format", "json", "--log-level", "debug"),
        )
        with daemon_process(short_tmp / "data", args=args) as daemon:
            _exercise(daemon.target)
            assert daemon.terminate() == 0
            output = daemon.log()
    assert_clean(output)
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert {"ts", "level", "logger", "msg"} <= set(lines[0])
    access = [d for d in lines if d["logger"] == "effectd.access"]
    assert any(d["code"] == "UNAUTHENTICATED" for d in access)
    assert any(d["principal"] == "agent-a" for d in access)
