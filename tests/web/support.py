"""A real daemon with the console's people's tokens, the console serving
in-process on a loopback port, and a form-posting HTTP client that keeps
cookies as a browser would (for the HTTP-level tests)."""

from __future__ import annotations

import http.client
import re
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from effectd_client import Client
from sidecar.clock import Clock
from sidecar.config import ServeConfig
from sidecar.testing import RunningDaemon, running_daemon
from sidecar.web import ConsoleConfig, ConsoleServer
from tests.support.tokens import CONSOLE, CONSOLE_AGENT, tokens_text

NAMESPACE = "team-c"
RUN = "run-c"


@contextmanager
def console_daemon(
    data_dir: Path, clock: Clock | None = None, **options: Any
) -> Iterator[tuple[RunningDaemon, ConsoleServer]]:
    """A daemon requiring the console's tokens (on `clock`), and a console
    in front of it (with the ConsoleConfig `options`)."""
    config = ServeConfig(
        data_dir=data_dir, init=True, tokens_text=tokens_text(*CONSOLE)
    )
    with running_daemon(config, clock) as daemon:
        server = ConsoleServer(
            ConsoleConfig(target=daemon.target, listen="127.0.0.1:0", **options)
        ).start()
        try:
            yield daemon, server
        finally:
            server.stop()


def agent(daemon: RunningDaemon) -> Client:
    return Client(
        daemon.target, namespace=NAMESPACE, token=CONSOLE_AGENT.secret, session=False
    )


def awaiting(
    daemon: RunningDaemon, call_id: str, tool: str = "send_email", value: object = None
) -> None:
    with agent(daemon) as c:
        c.prepare_tool(
            RUN,
            call_id,
            tool,
            value if value is not None else {"to": call_id},
            require_approval=True,
        )


def unknown(daemon: RunningDaemon, call_id: str) -> int:
    """A call whose outcome is unknown; answers its attempt."""
    with agent(daemon) as c:
        prepared = c.prepare_tool(RUN, call_id, "charge", {"id": call_id}, start=True)
        c.report_unknown(RUN, call_id, prepared.call.attempt, "the process died")
        return prepared.call.attempt


CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: str

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")

    def cookies(self) -> list[str]:
        return [v for k, v in self.headers if k.lower() == "set-cookie"]

    def csrf(self) -> str:
        found = CSRF.search(self.body)
        assert found, self.body
        return found.group(1)


@dataclass
class Browserless:
    """An HTTP client with a cookie jar; sends the console's own Origin
    unless told otherwise."""

    url: str
    jar: dict[str, str] = field(default_factory=dict)
    tls: ssl.SSLContext | None = None

    @property
    def origin(self) -> str:
        return self.url

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        parts = urlsplit(self.url)
        conn = (
            http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=30, context=self.tls
            )
            if self.tls is not None
            else http.client.HTTPConnection(
                parts.hostname or "", parts.port, timeout=30
            )
        )
        sent = {"Host": parts.netloc}
        if self.jar:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        body = None
        if form is not None:
            body = urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
            sent["Origin"] = self.origin
        sent.update(headers or {})
        sent = {k: v for k, v in sent.items() if v}
        try:
            conn.request(method, path, body=body, headers=sent)
            answer = conn.getresponse()
            response = Response(
                answer.status, answer.getheaders(), answer.read().decode("utf-8")
            )
        finally:
            conn.close()
        for cookie in response.cookies():
            jar: SimpleCookie = SimpleCookie()
            jar.load(cookie)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0":
                    self.jar.pop(name, None)
                else:
                    self.jar[name] = morsel.value
        return response

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str], **headers: str) -> Response:
        return self.request("POST", path, form, headers)

    def sign_in(self, token: str) -> Response:
        page = self.get("/signin")
        return self.post("/signin", {"csrf": page.csrf(), "token": token, "name": ""})
