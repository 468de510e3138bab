"""The sandbox's watching page (``/_sandbox/page``): the messages, lookups and calls the app
made and the inbound SMS sent, each callback with its attempts and the receiver's answers, a
"Send again" button, and a form that sends an inbound SMS.

Same rules as the relay's console: Jinja2 autoescapes every value (a receiver's answer is
attacker-controlled), every answer carries the console's strict Content-Security-Policy (no
script at all), forms are POSTs carrying a CSRF token (an HMAC of the session's nonce).

Access: a login form takes the API key and sets a signed session cookie (HttpOnly,
SameSite=Strict, scoped to the page's path); API clients send the key in the ``apikey`` header
instead (a header cannot be forged by another site's form, so they need no CSRF token). The
key never travels in a URL.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from itsdangerous import BadData, URLSafeTimedSerializer
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from receivers.problems import Problem
from relay.console.web import SECURITY_HEADERS as CONSOLE_HEADERS
from relay.sandbox import control, inbound_sms, lookups, tts
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.state import iso

PAGE = "/_sandbox/page"
COOKIE = "relay_sandbox_page"
SESSION_SECONDS = 12 * 3600
MAX_COOKIE = 512
MAX_FORM_BYTES = 4096
MAX_FORM_FIELDS = 8
SHOWN = 100
"""Records of each kind on the page (the newest)."""
ATTEMPTS_SHOWN = 10
"""Attempts of each callback on the page (the latest): a failing one has thousands in 48 h."""
SECURITY_HEADERS = {
    **CONSOLE_HEADERS,
    "content-security-policy": "; ".join(
        directive
        for directive in CONSOLE_HEADERS["content-security-policy"].split("; ")
        if not directive.startswith(("script-src", "connect-src"))
    ),
}
"""The console's headers, its Content-Security-Policy without the directives of the console's
live script: the page has no script at all (``default-src 'none'`` forbids every one)."""
HERE = Path(__file__).parent
STYLESHEET = HERE.parent / "console" / "static" / "console.css"


class PageAccess:
    """One sandbox's page sessions: signed cookies naming a nonce, and the live nonces."""

    def __init__(self, api_key: str) -> None:
        self._api_key = api_key
        self._secret = secrets.token_bytes(32)
        self._cookies = URLSafeTimedSerializer(self._secret, salt="relay-sandbox-page")
        self._live: set[str] = set()

    def key_matches(self, given: str | None) -> bool:
        """Whether ``given`` is the API key (constant time)."""
        if given is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self._api_key.encode())

    def open(self) -> str:
        """A new session: the cookie's value."""
        nonce = secrets.token_urlsafe(16)
        self._live.add(nonce)
        return self._cookies.dumps(nonce)

    def session(self, request: Request) -> str | None:
        """The nonce of the request's live session, if any."""
        cookie = request.cookies.get(COOKIE)
        if not cookie or len(cookie) > MAX_COOKIE:
            return None
        try:
            nonce = self._cookies.loads(cookie, max_age=SESSION_SECONDS)
        except (BadData, UnicodeError, ValueError):
            return None
        return nonce if isinstance(nonce, str) and nonce in self._live else None

    def end(self, nonce: str) -> None:
        self._live.discard(nonce)

    def csrf(self, nonce: str) -> str:
        return hmac.new(self._secret, f"csrf:{nonce}".encode(), hashlib.sha256).hexdigest()

    def csrf_matches(self, nonce: str, given: str | None) -> bool:
        if given is None:
            return False
        expected = self.csrf(nonce).encode()
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)

    def by_header(self, request: Request) -> bool:
        """Whether the request carries the key, once, in the ``apikey`` header."""
        given = request.headers.getlist("apikey")
        return len(given) == 1 and self.key_matches(given[0])


def templates() -> Environment:
    """The page's Jinja2 environment: every value escaped."""
    return Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (or no body at all), bounded, UTF-8, each field once; 400/413
    problems otherwise."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Problem(413, "body-too-large", "Content Too Large", "The form is too large.")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not body and not kind:
        return {}  # an API client's POST without a body
    if kind != "application/x-www-form-urlencoded":
        raise _bad("the body must be an urlencoded form")
    try:
        pairs = parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            errors="strict",
            max_num_fields=MAX_FORM_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        raise _bad("the form is not UTF-8 or has too many fields") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise _bad(f"{name[:40]!r} is given more than once")
        fields[name] = value
    return fields


def _bad(detail: str) -> Problem:
    return Problem(400, "invalid-request", "Bad Request", detail)


def page_routes(sandbox: Sandbox) -> list[Route]:
    """The page's routes for one sandbox."""
    access = PageAccess(sandbox.api_key)
    environment = templates()
    stylesheet = STYLESHEET.read_bytes()

    def html(status: int = 200, **values: Any) -> Response:
        text = environment.get_template("page.html").render(base=PAGE, **values)
        return HTMLResponse(
            text.encode("utf-8", "backslashreplace"), status_code=status, headers=SECURITY_HEADERS
        )

    def login_page(status: int = 200, message: str = "") -> Response:
        return html(status, title="Log in", login=True, csrf="", message=message)

    def records_page(
        nonce: str | None, *, status: int = 200, notice: str = "", error: str = ""
    ) -> Response:
        state = sandbox.state
        records = {
            "messages": [control.message_json(sandbox, m) for m in state.messages.values()],
            "lookups": [lookups.lookup_json(sandbox, r) for r in state.lookups.values()],
            "calls": [tts.call_json(sandbox, c) for c in state.calls.values()],
            "inbound": [inbound_sms.inbound_json(sandbox, r) for r in state.inbound.values()],
        }
        more = {k: len(v) for k, v in records.items() if len(v) > SHOWN}
        return html(
            status,
            title="Sandbox",
            csrf=access.csrf(nonce) if nonce else "",
            now=iso(sandbox.clock.now()),
            more=more,
            inbound_url=sandbox.settings.inbound_url,
            provisioned=sandbox.settings.inbound_number,
            default_sender=inbound_sms.DEFAULT_SENDER,
            attempts_shown=ATTEMPTS_SHOWN,
            notice=notice,
            error=error,
            **{k: list(reversed(v[-SHOWN:])) for k, v in records.items()},
        )

    async def show(request: Request) -> Response:
        nonce = access.session(request)
        if nonce is None and not access.by_header(request):
            return login_page(401)
        return records_page(nonce, notice=_notice(request))

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return login_page()
        fields = await read_form(request)
        if not access.key_matches(fields.get("apikey")):
            return login_page(401, "That is not the sandbox's API key.")
        answer = RedirectResponse(PAGE, status_code=303, headers=SECURITY_HEADERS)
        answer.set_cookie(
            COOKIE,
            access.open(),
            max_age=SESSION_SECONDS,
            path=PAGE,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    async def checked(request: Request) -> dict[str, str]:
        """A POST's form, once its session and CSRF token (or its apikey header) check."""
        fields = await read_form(request)
        if access.by_header(request):
            return fields
        nonce = access.session(request)
        if nonce is None:
            raise Problem(401, "unauthorized", "Unauthorized", "Log in to the sandbox's page.")
        if not access.csrf_matches(nonce, fields.get("csrf")):
            raise Problem(403, "forbidden", "Forbidden", "The form's CSRF token does not match.")
        return fields

    async def logout(request: Request) -> Response:
        await checked(request)
        nonce = access.session(request)
        if nonce is not None:
            access.end(nonce)
        answer = RedirectResponse(f"{PAGE}/login", status_code=303, headers=SECURITY_HEADERS)
        answer.delete_cookie(COOKIE, path=PAGE)
        return answer

    async def resend(request: Request) -> Response:
        await checked(request)
        callback = sandbox.state.callbacks.get(request.path_params["id"])
        if callback is None:
            raise Problem(404, "not-found", "Not Found", "No callback with this id.")
        sandbox.scheduler.resend(callback)
        return RedirectResponse(f"{PAGE}?sent=1", status_code=303, headers=SECURITY_HEADERS)

    async def send_inbound(request: Request) -> Response:
        fields = await checked(request)
        wanted = {k: v for k, v in fields.items() if k != "csrf"}
        try:
            parsed = inbound_sms.parse_inbound(
                wanted, sandbox.settings.inbound_number, inbound_sms.FORM_FIELDS
            )
            inbound_sms.send_inbound(sandbox, parsed)
        except Problem as problem:
            if problem.status not in (400, 409, 503):
                raise
            nonce = access.session(request)
            return records_page(nonce, status=problem.status, error=problem.detail)
        return RedirectResponse(f"{PAGE}?inbound=1", status_code=303, headers=SECURITY_HEADERS)

    async def css(request: Request) -> Response:
        return Response(stylesheet, media_type="text/css", headers=SECURITY_HEADERS)

    return [
        Route(PAGE, show, methods=["GET"]),
        Route(f"{PAGE}/login", login, methods=["GET", "POST"]),
        Route(f"{PAGE}/logout", logout, methods=["POST"]),
        Route(f"{PAGE}/callbacks/{{id}}/resend", resend, methods=["POST"]),
        Route(f"{PAGE}/inbound", send_inbound, methods=["POST"]),
        Route(f"{PAGE}/console.css", css, methods=["GET"]),
    ]


NOTICES = {
    "sent": "Sent again: see its new attempt.",
    "inbound": "Inbound SMS sent to the inbound URL: see it under Inbound SMS.",
}
"""The page's notices after a form, by query parameter (``?sent=1``): fixed texts, so nothing
of the URL is ever shown."""


def _notice(request: Request) -> str:
    shown = [text for name, text in NOTICES.items() if request.query_params.get(name) == "1"]
    return shown[0] if shown else ""
