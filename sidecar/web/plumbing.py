"""The plumbing of the console's HTTP side: answers with the security
headers every page carries, cookies (HttpOnly, SameSite=Strict, Secure
behind TLS), the session of a request, and the checks every state-changing
request passes before anything else: the Host it was sent to (a name the
console answers to, against DNS rebinding) and its Origin (the console's
own pages). The CSRF token of the session's forms is checked by the routes
(`sidecar.web.app`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from effectd_client import Connection
from sidecar.web.html import notice, page
from sidecar.web.sessions import COOKIE, Session, Sessions

MAX_FORM_BYTES = 64 * 1024
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; "
    "style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True)
class Settings:
    """How the console reaches the daemon and how it is reached."""

    connection: Callable[[str], Connection]
    timeout: float
    # The Host values the console answers to (HOST:PORT), and the scheme:
    # a request to another name is refused (DNS rebinding).
    hosts: frozenset[str]
    tls: bool
    token_required: bool

    def origins(self) -> frozenset[str]:
        scheme = "https" if self.tls else "http"
        return frozenset(f"{scheme}://{h}" for h in self.hosts)


class Refused(Exception):
    """A request refused before the daemon is asked: status and text."""

    def __init__(self, status: HTTPStatus, text: str) -> None:
        super().__init__(text)
        self.status = status


class Plumbing(BaseHTTPRequestHandler):
    """One request. `settings` and `sessions` are set on the subclass the
    server is made with."""

    settings: Settings
    sessions: Sessions
    server_version = "effectd-console"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: query strings name runs and calls

    # -- plumbing -------------------------------------------------------------

    def _send(
        self,
        status: HTTPStatus,
        body: str | bytes,
        content_type: str = "text/html; charset=utf-8",
        *,
        cookies: tuple[str, ...] = (),
        location: str = "",
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else body
        self.send_response(status)
        for name, value in _HEADERS.items():
            self.send_header(name, value)
        if self.settings.tls:
            self.send_header("Strict-Transport-Security", "max-age=31536000")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for cookie in cookies:
            self.send_header("Set-Cookie", cookie)
        if location:
            self.send_header("Location", location)
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _cookie(self, name: str, value: str, max_age: int | None = None) -> str:
        parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
        if self.settings.tls:
            parts.append("Secure")
        if max_age is not None:
            parts.append(f"Max-Age={max_age}")
        return "; ".join(parts)

    def _cookies(self) -> dict[str, str]:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie", ""))
        except Exception:  # a malformed header: no cookies
            return {}
        return {k: m.value for k, m in jar.items()}

    def _session(self) -> tuple[str, Session | None]:
        sid = self._cookies().get(COOKIE, "")
        return sid, self.sessions.get(sid)

    def _redirect(self, location: str, cookies: tuple[str, ...] = ()) -> None:
        self._send(HTTPStatus.SEE_OTHER, "", cookies=cookies, location=location)

    def _page(
        self,
        title: str,
        body: str,
        session: Session | None,
        status: HTTPStatus = HTTPStatus.OK,
        *,
        live: bool = False,
        cookies: tuple[str, ...] = (),
    ) -> None:
        self._send(
            status, page(title, body, session=session, live=live), cookies=cookies
        )

    def _check_host(self) -> None:
        # Exactly one Host (RFC 9112 3.2: more is a bad request): with two,
        # this check and whatever reads the other would disagree on the
        # name the request was sent to.
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:
            raise Refused(HTTPStatus.BAD_REQUEST, "More than one Host header.")
        if (hosts[0] if hosts else "") not in self.settings.hosts:
            raise Refused(HTTPStatus.MISDIRECTED_REQUEST, "Not this console's address.")

    def _check_origin(self) -> None:
        """A state-changing request must come from the console's own pages:
        its Origin (or, without one, its Referer) is the console's."""
        origin = self.headers.get("Origin")
        if origin is None:
            referer = urlsplit(self.headers.get("Referer", ""))
            origin = f"{referer.scheme}://{referer.netloc}" if referer.netloc else ""
        if origin not in self.settings.origins():
            raise Refused(
                HTTPStatus.FORBIDDEN,
                "Refused: this request did not come from the console's own "
                "pages (cross-site request forgery protection). Nothing changed.",
            )

    def _form(self) -> dict[str, str]:
        length = whole_number(self.headers.get("Content-Length") or "0", 2**63 - 1)
        if length is None:
            raise Refused(HTTPStatus.BAD_REQUEST, "Send the page's form.")
        if length > MAX_FORM_BYTES:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "The form is too large.")
        kind = self.headers.get("Content-Type", "").split(";")[0].strip()
        if kind != "application/x-www-form-urlencoded":
            raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "Send the page's form.")
        raw = self.rfile.read(length).decode("utf-8", "replace")
        return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}

    def _refused(self, exc: Refused) -> None:
        _, session = self._session()
        self._page("Refused", notice(str(exc), "error"), session, exc.status)

    # -- GET --------------------------------------------------------------------


def whole_number(text: str, most: int) -> int | None:
    """`text` as a whole number of at most `most`, or None: ASCII digits
    only (`str.isdigit` also takes "²", which `int` refuses, and Arabic-Indic
    digits, which `int` reads), within the range of the field it fills."""
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= most else None
