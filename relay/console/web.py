"""What every console page shares: templates, security headers, forms, errors, sessions.

Payloads are attacker-controlled, so templates escape everything (Jinja2's autoescape) and
every answer carries a Content-Security-Policy without inline styles and without scripts but
one: the console's own live counts, allowed by its hash (:mod:`relay.console.script`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from receivers.auth import IPAddress, client_address
from receivers.problems import Problem
from receivers.sources import Network
from receivers.store import StoreWritable
from relay.console.filters import BadFilter
from relay.console.login_cookies import LoginCookies
from relay.console.script import LIVE_SCRIPT, script_hash
from relay.console.sessions import SESSION_COOKIE, Operator, Sessions
from relay.console.throttle import LoginThrottle
from relay.console.users import Users
from relay.console.wording import attempt_outcome, count_text, last_answer
from relay.outbox import RELAY_WRITES, Due

CONSOLE_PATH = "/console"
OPERATOR = "relay.console.operator"
"""Where :class:`SessionCheck` leaves a request's operator in its ASGI scope."""
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
HERE = Path(__file__).parent
MAX_FORM_BYTES = 16 * 1024
MAX_FORM_FIELDS = 32
SECURITY_HEADERS = {
    "content-security-policy": (
        f"default-src 'none'; script-src {script_hash(LIVE_SCRIPT)}; connect-src 'self'; "
        "style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

Enqueue = Callable[[list[Due]], Awaitable[None]]
"""Hands due deliveries to the relay's queue at once (the embedded worker is woken)."""


@dataclass
class Console:
    """Everything the console's endpoints use; one per app."""

    engine: AsyncEngine
    users: Users
    sessions: Sessions
    login_cookies: LoginCookies
    enqueue: Enqueue
    clock: Callable[[], datetime]
    sources: list[str]
    destinations: list[str]
    targets: dict[str, str]
    """Each destination's type and target (addresses without credentials)."""
    secure_cookie: bool
    throttle: LoginThrottle
    trusted_proxies: tuple[Network, ...]
    """Proxies whose X-Forwarded-For names the client (as for the receivers)."""
    templates: Environment
    writable: StoreWritable = field(default_factory=lambda: StoreWritable(RELAY_WRITES))
    """The server's state of the relay's writes, told when the store refuses an action's."""

    def page(
        self,
        request: Request,
        name: str,
        operator: Operator | None,
        status: int = 200,
        **values: Any,
    ) -> Response:
        """A rendered page; ``operator`` gives it the navigation and the CSRF token."""
        template = self.templates.get_template(name)
        html = template.render(
            base=CONSOLE_PATH,
            operator=operator,
            csrf=self.sessions.csrf_token(operator) if operator else "",
            path=request.url.path,
            **values,
        )
        # a stored payload may hold a lone surrogate (valid JSON, no UTF-8): shown as its escape
        return HTMLResponse(html.encode("utf-8", "backslashreplace"), status_code=status)

    def operator(self, request: Request) -> Operator | None:
        """The request's logged-in user, as :class:`SessionCheck` found it."""
        operator = request.scope.get(OPERATOR)
        return operator if isinstance(operator, Operator) else None

    def cookie_secure(self, request: Request) -> bool:
        return self.secure_cookie or request.url.scheme == "https"

    def client(self, request: Request) -> IPAddress | None:
        """The client's address: the peer, or X-Forwarded-For's behind a trusted proxy."""
        peer = request.client.host if request.client else None
        forwarded = ",".join(request.headers.getlist("x-forwarded-for")) or None
        return client_address(peer, forwarded, self.trusted_proxies)


def templates() -> Environment:
    """The console's Jinja2 environment: every value escaped."""
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["moment"] = moment
    environment.filters["pretty_json"] = lambda value: json.dumps(
        value, indent=2, ensure_ascii=False, sort_keys=True
    )
    environment.filters["body_text"] = body_text
    environment.filters["count"] = count_text
    environment.filters["outcome"] = attempt_outcome
    environment.filters["last_answer"] = last_answer
    return environment


def moment(value: datetime | None) -> str:
    """A stored time as the console shows it (UTC, to the millisecond)."""
    if value is None:
        return "-"
    return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"


def body_text(raw: bytes) -> str:
    """A stored body as text: UTF-8, undecodable bytes and control characters (but for line
    breaks and tabs) shown as \\x escapes."""
    text = raw.decode("utf-8", "backslashreplace")
    return CONTROL.sub(lambda match: f"\\x{ord(match[0]):02x}", text)


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every answer of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class SessionCheck:
    """Looks a request's session up once, before routing, and leaves its operator (or None)
    in the scope for pages, actions and error pages alike."""

    def __init__(self, app: ASGIApp, sessions: Sessions) -> None:
        self.app = app
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            cookie = Request(scope).cookies.get(SESSION_COOKIE)
            scope[OPERATOR] = await self.sessions.operator(cookie)
        await self.app(scope, receive, send)


def single_values(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Query or form fields as a dict; a field given twice is refused (which one would win?)."""
    values: dict[str, str] = {}
    for name, value in pairs:
        if name in values:
            raise BadFilter(f"{name[:40]}: given more than once")
        values[name] = value
    return values


def query(request: Request) -> dict[str, str]:
    """The request's query parameters, each at most once, in UTF-8 (raw or percent-escaped;
    Starlette would replace what is not)."""
    return single_values(utf8_pairs(request.scope.get("query_string", b""), "the query"))


async def form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the only kind the console's forms send), bounded."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise BadFilter("the body must be an urlencoded form")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadFilter(f"the form is larger than {MAX_FORM_BYTES} bytes")
    pairs = utf8_pairs(body, "the form")
    return single_values(pairs)


def utf8_pairs(encoded: bytes, what: str) -> list[tuple[str, str]]:
    """The name-value pairs of an urlencoded string; :class:`BadFilter` when it (or a
    percent-escape in it) is not UTF-8, or has too many fields."""
    try:
        return parse_qsl(
            encoded.decode("utf-8"),
            keep_blank_values=True,
            errors="strict",
            max_num_fields=MAX_FORM_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        raise BadFilter(f"{what} is not UTF-8 or has too many fields") from None


def error(console: Console, request: Request, status: int, title: str, detail: str) -> Response:
    """An error as a page for a browser, else as RFC 7807 problem+json."""
    if "text/html" in request.headers.get("accept", ""):
        return console.page(
            request,
            "error.html",
            console.operator(request),
            status=status,
            title=title,
            detail=detail,
        )
    slug = title.lower().replace(" ", "-")
    return Problem(status, slug, title, detail).response()


def see_other(location: str) -> Response:
    return RedirectResponse(location, status_code=303)


def safe_next(value: str | None, default: str) -> str:
    """A place inside the console to go to after a login or an action (never elsewhere)."""
    if (
        value
        and value.startswith(CONSOLE_PATH + "/")
        and "//" not in value
        and "\\" not in value
        and "%" not in value.split("?")[0]  # no encoded dot-segments in the path
        and "/." not in value.split("?")[0]
        and value.isprintable()
        and len(value) <= 2000
    ):
        return value
    return default


def form_values(pairs: Mapping[str, str], *names: str) -> dict[str, str]:
    """The named fields of a form (only those), for a filter."""
    return {name: pairs[name] for name in names if name in pairs}
