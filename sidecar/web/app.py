"""The console's pages and actions: routing, sign-in and sign-out, and the
CSRF token every form of a session carries (the Host and Origin checks are
in `sidecar.web.plumbing`). Pages are rendered by
`sidecar.web.pages` and `sidecar.web.callpage`; every decision is the
daemon's, reached through `sidecar.web.daemon`.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from effectd.v1 import ledger_pb2 as pb

from effectd_client import EffectdError
from sidecar.web import callpage, pages
from sidecar.web.daemon import Daemon, Ref
from sidecar.web.html import notice
from sidecar.web.plumbing import Plumbing, Refused, whole_number
from sidecar.web.sessions import COOKIE, Session

SIGNIN_COOKIE = "effectd_console_signin"
_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")
_STATIC = {
    "/static/console.css": "text/css; charset=utf-8",
    "/static/live.js": "text/javascript; charset=utf-8",
}
# How a refused read is answered; anything else (the daemon unreachable,
# a deadline) is a bad gateway.
_STATUS = {
    "INVALID_ARGUMENT": HTTPStatus.BAD_REQUEST,
    "NOT_FOUND": HTTPStatus.NOT_FOUND,
    "PERMISSION_DENIED": HTTPStatus.FORBIDDEN,
    "UNAUTHENTICATED": HTTPStatus.UNAUTHORIZED,
    "FAILED_PRECONDITION": HTTPStatus.CONFLICT,
}
# The largest values of the request fields a form's numbers fill.
_UINT64, _UINT32 = 2**64 - 1, 2**32 - 1
_DONE = {
    "approve": "You approved the call: the agent may now start it.",
    "reject": "You rejected the call: the agent gets the rejection as its result.",
    "committed": "Reconciled: the call is committed with the result you found.",
    "not_executed": "Reconciled: the call never ran and may be executed again.",
}


class Handler(Plumbing):
    """The console's pages and actions."""

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        try:
            self._check_host()
            self._get()
        except Refused as exc:
            self._refused(exc)

    def _get(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path in _STATIC:
            name = url.path.rsplit("/", 1)[1]
            data = resources.files("sidecar.web").joinpath("static", name).read_bytes()
            self._send(HTTPStatus.OK, data, _STATIC[url.path])
            return
        if url.path == "/favicon.ico":
            self._send(HTTPStatus.NOT_FOUND, "", "text/plain")
            return
        if url.path == "/signin":
            self._signin_form()
            return
        _, session = self._session()
        if session is None:
            if url.path == "/queue.fragment":
                self._send(HTTPStatus.UNAUTHORIZED, "", "text/plain")
            else:
                self._redirect("/signin")
            return
        routes: dict[str, Callable[[Session, dict[str, str]], None]] = {
            "/": self._queue,
            "/queue.fragment": self._fragment,
            "/call": self._call,
            "/run": self._run,
            "/audit": self._audit,
        }
        route = routes.get(url.path)
        if route is None:
            self._page(
                "Not found",
                notice("No such page.", "error"),
                session,
                HTTPStatus.NOT_FOUND,
            )
            return
        try:
            route(session, query)
        except EffectdError as exc:
            self._daemon_refused(session, exc)

    def _daemon_refused(self, session: Session | None, exc: EffectdError) -> None:
        """A page the daemon refused (or did not answer) to read."""
        status = _STATUS.get(exc.code.name, HTTPStatus.BAD_GATEWAY)
        self._page("Refused", notice(callpage.refusal(exc), "error"), session, status)

    def _signin_form(self, error: str = "", status: HTTPStatus = HTTPStatus.OK) -> None:
        # One check per browser: a second sign-in page (another tab) must not
        # invalidate the first one's form.
        token = self._cookies().get(SIGNIN_COOKIE, "")
        if not _TOKEN_SHAPE.fullmatch(token):
            token = secrets.token_urlsafe(32)
        body = pages.signin(token, error, token_required=self.settings.token_required)
        self._page(
            "Sign in", body, None, status, cookies=(self._cookie(SIGNIN_COOKIE, token),)
        )

    def _queue(self, session: Session, query: dict[str, str]) -> None:
        calls = session.daemon.waiting()
        previews = session.daemon.previews(calls)
        body = pages.queue_page(calls, previews, time.time_ns())
        self._page("Waiting for a person", body, session, live=True)

    def _fragment(self, session: Session, query: dict[str, str]) -> None:
        calls = session.daemon.waiting()
        previews = session.daemon.previews(calls)
        fragment = pages.queue(calls, previews, time.time_ns())
        self._send(
            HTTPStatus.OK, fragment, extra=(("X-Queue-Digest", pages.digest(calls)),)
        )

    def _ref(self, query: dict[str, str]) -> Ref:
        ref = Ref(
            query.get("namespace", ""), query.get("run", ""), query.get("call", "")
        )
        if not ref.run_id or not ref.call_id:
            raise Refused(HTTPStatus.BAD_REQUEST, "Name a run and a call.")
        return ref

    def _call(self, session: Session, query: dict[str, str]) -> None:
        call = session.daemon.call(self._ref(query))
        done = _DONE.get(query.get("done", ""), "")
        self._call_page(session, call, done, "ok")

    def _call_page(
        self,
        session: Session,
        call: pb.ToolCall,
        message: str,
        kind: str,
        status: HTTPStatus = HTTPStatus.OK,
    ) -> None:
        """A call's page, with the other calls of its run."""
        run = session.daemon.calls(
            run_id=call.ref.run_id,
            namespace=call.ref.namespace,
            limit=callpage.RUN_CALLS + 2,
        )
        body = callpage.call_page(
            call, session.csrf, message, kind, run=run, now_ns=time.time_ns()
        )
        self._page(f"Call {call.ref.call_id}", body, session, status, live=True)

    def _run(self, session: Session, query: dict[str, str]) -> None:
        namespace, run_id = query.get("namespace", ""), query.get("run", "")
        calls = session.daemon.calls(run_id=run_id, namespace=namespace)
        body = pages.run_page(namespace, run_id, calls, session.csrf)
        self._page(f"Run {run_id}", body, session)

    def _audit(self, session: Session, query: dict[str, str]) -> None:
        namespace = query.get("namespace", "")
        verified, verify_refused = None, ""
        try:
            verified = session.daemon.verify()
        except EffectdError as exc:
            verify_refused = callpage.refusal(exc)
        try:
            entries, refused = session.daemon.audit(namespace), ""
        except EffectdError as exc:
            entries, refused = [], callpage.refusal(exc)
        body = pages.audit_page(namespace, entries, verified, verify_refused, refused)
        self._page("Audit log", body, session)

    # -- POST -------------------------------------------------------------------

    def do_POST(self) -> None:
        try:
            self._check_host()
            self._check_origin()
            form = self._form()
            self._post(form)
        except Refused as exc:
            self._refused(exc)
        except EffectdError as exc:
            # A read after the action, refused or unanswered: the action's
            # own refusals are answered on the call's page.
            self._daemon_refused(self._session()[1], exc)

    def _post(self, form: dict[str, str]) -> None:
        path = urlsplit(self.path).path
        if path == "/signin":
            self._signin(form)
            return
        sid, session = self._session()
        if session is None or not session.csrf_matches(form.get("csrf", "")):
            raise Refused(
                HTTPStatus.FORBIDDEN,
                "Refused: the form's session check failed (sign in again and use "
                "the console's own pages). Nothing changed.",
            )
        if path == "/signout":
            self.sessions.close(sid)
            self._redirect("/signin", (self._cookie(COOKIE, "", max_age=0),))
            return
        actions = {
            "/call/decide": self._decide,
            "/call/reconcile": self._reconcile,
            "/run/recover": self._recover,
        }
        action = actions.get(path)
        if action is None:
            raise Refused(HTTPStatus.NOT_FOUND, "No such action.")
        action(session, form)

    def _signin(self, form: dict[str, str]) -> None:
        expected = self._cookies().get(SIGNIN_COOKIE, "")
        if not expected or not secrets.compare_digest(
            expected.encode(), form.get("csrf", "").encode()
        ):
            raise Refused(
                HTTPStatus.FORBIDDEN,
                "Refused: the sign-in form's check failed; open the sign-in page "
                "again.",
            )
        token, name = form.get("token", "").strip(), form.get("name", "").strip()
        if not token and self.settings.token_required:
            self._signin_form("This console needs a token.", HTTPStatus.UNAUTHORIZED)
            return
        try:
            daemon = Daemon(self.settings.connection(token), self.settings.timeout)
        except ValueError:
            self._signin_form("That is not a token.", HTTPStatus.UNAUTHORIZED)
            return
        try:
            caller, roles = daemon.check()
        except EffectdError as exc:
            daemon.close()
            why = (
                "The daemon does not know this token."
                if exc.code.name == "UNAUTHENTICATED"
                else f"The daemon did not answer: {exc.message}"
            )
            self._signin_form(why, HTTPStatus.UNAUTHORIZED)
            return
        if not token and not name:
            daemon.close()
            self._signin_form(
                "The daemon has no tokens: give your name, which the audit log "
                "records for your decisions.",
                HTTPStatus.BAD_REQUEST,
            )
            return
        # With a token, the daemon's name for it, which it records too.
        shown = caller if token else name
        sid = self.sessions.open(
            Session(daemon, "" if token else name, shown, roles=roles)
        )
        self._redirect(
            "/",
            (self._cookie(COOKIE, sid), self._cookie(SIGNIN_COOKIE, "", max_age=0)),
        )

    def _after(self, ref: Ref, done: str) -> None:
        query = urlencode(
            {
                "namespace": ref.namespace,
                "run": ref.run_id,
                "call": ref.call_id,
                "done": done,
            }
        )
        self._redirect(f"/call?{query}")

    def _refused_decision(self, session: Session, ref: Ref, exc: EffectdError) -> None:
        status = (
            HTTPStatus.CONFLICT
            if exc.reason in ("REVISION_CONFLICT", "INPUT_MISMATCH")
            else HTTPStatus.FORBIDDEN
            if exc.code.name == "PERMISSION_DENIED"
            else HTTPStatus.BAD_REQUEST
        )
        try:
            call = session.daemon.call(ref)
        except EffectdError as again:
            self._page(
                "Refused",
                notice(callpage.refusal(exc), "error")
                + notice(callpage.refusal(again), "error"),
                session,
                status,
            )
            return
        self._call_page(session, call, callpage.refusal(exc), "error", status)

    def _revision(self, form: dict[str, str]) -> int:
        revision = whole_number(form.get("revision", ""), _UINT64)
        if revision is None:
            raise Refused(HTTPStatus.BAD_REQUEST, "The form has no revision.")
        return revision

    def _decide(self, session: Session, form: dict[str, str]) -> None:
        ref = self._ref(form)
        decision = form.get("decision", "")
        if decision not in ("approve", "reject"):
            raise Refused(HTTPStatus.BAD_REQUEST, "Approve or reject.")
        try:
            session.daemon.operator.decide(
                ref.run_id,
                ref.call_id,
                namespace=ref.namespace,
                approve=decision == "approve",
                approver=session.actor,
                reason=form.get("reason", ""),
                expected_revision=self._revision(form),
                input_fingerprint=form.get("fingerprint", ""),
            )
        except EffectdError as exc:
            self._refused_decision(session, ref, exc)
            return
        self._after(ref, decision)

    def _reconcile(self, session: Session, form: dict[str, str]) -> None:
        ref = self._ref(form)
        resolution = form.get("resolution", "")
        if resolution not in ("committed", "not_executed"):
            raise Refused(HTTPStatus.BAD_REQUEST, "Say whether the call ran.")
        result: Any = None
        if resolution == "committed":
            try:
                result = json.loads(form.get("result", "") or "null")
            except (ValueError, RecursionError):
                raise Refused(
                    HTTPStatus.BAD_REQUEST, "The result found is not valid JSON."
                ) from None
        dead = whole_number(form.get("confirmed_dead_attempt", "") or "0", _UINT32)
        if dead is None:
            raise Refused(HTTPStatus.BAD_REQUEST, "The attempt is not a number.")
        try:
            session.daemon.operator.reconcile(
                ref.run_id,
                ref.call_id,
                namespace=ref.namespace,
                expected_revision=self._revision(form),
                operator=session.actor,
                reason=form.get("reason", ""),
                evidence=form.get("evidence", ""),
                result=result,
                not_executed=resolution == "not_executed",
                confirmed_dead_attempt=dead,
            )
        except EffectdError as exc:
            self._refused_decision(session, ref, exc)
            return
        self._after(ref, resolution)

    def _recover(self, session: Session, form: dict[str, str]) -> None:
        namespace, run_id = form.get("namespace", ""), form.get("run", "")
        plan, refused = None, ""
        try:
            plan = list(session.daemon.recover(namespace, run_id))
        except EffectdError as exc:
            refused = callpage.refusal(exc)
        calls = session.daemon.calls(run_id=run_id, namespace=namespace)
        body = pages.run_page(
            namespace, run_id, calls, session.csrf, plan=plan, refused=refused
        )
        self._page(f"Run {run_id}", body, session)
