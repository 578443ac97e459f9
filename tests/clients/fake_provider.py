"""A fake LLM provider on 127.0.0.1 behind a real daemon.

The HTTP side is the scripted upstream of `tests.provider.upstream` (it
counts and records every request); this module adds the answers of the
OpenAI and Anthropic APIs the SDKs parse, and `proxied`, a real daemon whose
routes `openai` (Authorization from a credential file) and `anthropic`
(x-api-key from an environment variable) point at the fake.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sidecar.config import ServeConfig, ServerLimits
from sidecar.testing import running_daemon
from tests.provider.upstream import Reply, Upstream, serving

OPENAI_KEY = "sk-openai-route-secret-1"
ANTHROPIC_KEY = "sk-ant-route-secret-2"
ANTHROPIC_ENV = "EFFECTD_TEST_ANTHROPIC_KEY"
JSON = (("content-type", "application/json"),)


def _sse(data: Any, event: str = "") -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def openai_completion(content: str = "Hello there") -> Reply:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1764633600,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    return Reply(200, (*JSON, ("x-request-id", "req-1")), json.dumps(body).encode())


def openai_chunks(*parts: str) -> list[bytes]:
    """Chat completion chunks, one per part, a final one, then [DONE]."""

    def chunk(delta: dict[str, str], finish: str | None) -> bytes:
        return _sse(
            {
                "id": "chatcmpl-2",
                "object": "chat.completion.chunk",
                "created": 1764633600,
                "model": "gpt-test",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    out = [chunk({"role": "assistant", "content": ""}, None)]
    out += [chunk({"content": p}, None) for p in parts]
    out.append(chunk({}, "stop"))
    out.append(_sse("[DONE]"))
    return out


def anthropic_message(text: str = "Hi from Claude") -> Reply:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 4, "output_tokens": 3},
    }
    return Reply(200, (*JSON, ("request-id", "req-a")), json.dumps(body).encode())


def anthropic_events(*parts: str) -> list[bytes]:
    """message_start, a text block of `parts` (a ping between), message_stop."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_2",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 4, "output_tokens": 1},
        },
    }
    out = [_sse(start, "message_start")]
    block = {"type": "text", "text": ""}
    out.append(
        _sse(
            {"type": "content_block_start", "index": 0, "content_block": block},
            "content_block_start",
        )
    )
    out.append(_sse({"type": "ping"}, "ping"))
    for p in parts:
        delta = {"type": "text_delta", "text": p}
        out.append(
            _sse(
                {"type": "content_block_delta", "index": 0, "delta": delta},
                "content_block_delta",
            )
        )
    out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    out.append(
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
            "message_delta",
        )
    )
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


def rate_limited(retry_after_ms: int = 50) -> Reply:
    body = {"error": {"type": "rate_limit_error", "message": "slow down"}}
    return Reply(
        429,
        (*JSON, ("retry-after-ms", str(retry_after_ms)), ("x-should-retry", "true")),
        json.dumps(body).encode(),
    )


@contextmanager
def proxied(
    tmp: Path,
    *script: Reply,
    max_retries: int = 2,
    effect: str = "inference",
    default_deadline: float = 60.0,
) -> Iterator[tuple[str, Upstream]]:
    """The daemon's target and the fake upstream both routes point at;
    `effect` is both routes' setting, `default_deadline` the daemon's deadline
    of a call that brings none."""
    with serving(*script) as up:
        (tmp / "openai.key").write_text(OPENAI_KEY + "\n")
        providers = tmp / "providers.toml"
        common = f'paths = ["/v1/"]\nmax_retries = {max_retries}\neffect = "{effect}"\n'
        providers.write_text(
            f'[routes.openai]\nbase_url = "{up.base_url}"\n'
            f'credential_file = "{tmp / "openai.key"}"\n{common}'
            f'[routes.anthropic]\nbase_url = "{up.base_url}"\n'
            f'credential_env = "{ANTHROPIC_ENV}"\ncredential_header = "x-api-key"\n'
            f"{common}"
        )
        os.environ[ANTHROPIC_ENV] = ANTHROPIC_KEY
        try:
            config = ServeConfig(
                data_dir=tmp / "data",
                init=True,
                providers_file=providers,
                server_limits=ServerLimits(default_deadline_seconds=default_deadline),
            )
            with running_daemon(config) as running:
                yield running.target, up
        finally:
            del os.environ[ANTHROPIC_ENV]
