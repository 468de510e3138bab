"""The console's Starlette app, mounted at ``/console`` by `relay serve`.

Every page needs a session; every action (POST) also needs the session's CSRF token. A
request that cannot show either is refused: a page redirects to the login, an action is 403.
Logins go through the throttle, which answers 429 with Retry-After while a key waits.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from urllib.parse import urlencode

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from receivers.sources import Network
from receivers.store import StoreWritable
from relay.console import actions, live, pages
from relay.console.filters import BadFilter
from relay.console.login_cookies import (
    DEVICE_COOKIE,
    DEVICE_LIFETIME,
    LOGIN_COOKIE,
    LOGIN_FORM_LIFETIME,
    LoginCookies,
)
from relay.console.sessions import REPLACED, SESSION_COOKIE, Operator, Sessions
from relay.console.throttle import LoginThrottle
from relay.console.throttle_rule import login_attempt
from relay.console.unavailable import DatabaseDown
from relay.console.users import Users
from relay.console.web import (
    CONSOLE_PATH,
    HERE,
    Console,
    Enqueue,
    SecurityHeaders,
    SessionCheck,
    error,
    form,
    safe_next,
    see_other,
    templates,
)
from relay.outbox import RELAY_WRITES

log = logging.getLogger("relay.console")

Page = Callable[[Console, Request, Operator], Awaitable[Response]]
Action = Callable[[Console, Request, Operator, Mapping[str, str]], Awaitable[Response]]


def console_app(
    engine: AsyncEngine,
    users: Users,
    key: str,
    enqueue: Enqueue,
    *,
    sources: list[str],
    destinations: list[str],
    clock: Callable[[], datetime],
    session_lifetime: timedelta,
    secure_cookie: bool = False,
    targets: Mapping[str, str] | None = None,
    trusted_proxies: Sequence[Network] = (),
    writable: StoreWritable | None = None,
) -> Starlette:
    """The console over this store for ``users``, its cookies and tokens signed with ``key``;
    ``enqueue`` hands what an action made due to the relay. An action whose write the store
    refuses (full, unreachable) is answered 503 and noted in ``writable`` (the server's state of
    the relay's writes), which logs it once."""
    sessions = Sessions(engine, users, key, session_lifetime, clock)
    kept_keys = [f"user:{name}" for name in users.names]
    console = Console(
        engine=engine,
        users=users,
        sessions=sessions,
        login_cookies=LoginCookies(key, clock),
        enqueue=enqueue,
        clock=clock,
        sources=sources,
        destinations=destinations,
        targets=dict(targets or {}),
        secure_cookie=secure_cookie,
        throttle=LoginThrottle(engine, clock, kept_keys=kept_keys),
        trusted_proxies=tuple(trusted_proxies),
        templates=templates(),
        writable=writable if writable is not None else StoreWritable(RELAY_WRITES),
    )
    stylesheet = (HERE / "static" / "console.css").read_bytes()

    def page(view: Page) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            operator = console.operator(request)
            if operator is None:
                wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return see_other(f"{CONSOLE_PATH}/login?{urlencode({'next': wanted})}")
            return await view(console, request, operator)

        return endpoint

    def data(view: Page) -> Callable[[Request], Awaitable[Response]]:
        """An endpoint a page's script reads: the same session, but a 403 problem without
        one (a script cannot follow a redirect to the login)."""

        async def endpoint(request: Request) -> Response:
            operator = console.operator(request)
            if operator is None:
                return error(console, request, 403, "Forbidden", "Log in to the console first.")
            return await view(console, request, operator)

        return endpoint

    def action(do: Action) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            operator = console.operator(request)
            if operator is None:
                return error(console, request, 403, "Forbidden", "Log in to the console first.")
            try:
                fields = await form(request)
            except BadFilter as exc:
                return error(console, request, 400, "Bad Request", str(exc))
            if not sessions.csrf_matches(operator, fields.get("csrf")):
                return error(
                    console,
                    request,
                    403,
                    "Forbidden",
                    "The form's CSRF token is missing or wrong: reload the page and try again.",
                )
            try:
                return await do(console, request, operator, fields)
            except Exception as exc:
                if not console.writable.failed(exc):
                    raise
                state = "full" if console.writable.full else "unavailable"
                return error(
                    console,
                    request,
                    503,
                    "Service Unavailable",
                    f"The store is {state} and refuses writes: try again later.",
                )

        return endpoint

    async def login_page(request: Request) -> Response:
        if request.method == "POST":
            return await login(request)
        return _login_page(console, request, 200, "", request.query_params.get("next"))

    async def login(request: Request) -> Response:
        try:
            fields = await form(request)
        except BadFilter as exc:
            return error(console, request, 400, "Bad Request", str(exc))
        wanted = fields.get("next")
        cookies = console.login_cookies
        if not cookies.form_matches(request.cookies.get(LOGIN_COOKIE), fields.get("token")):
            return _login_page(console, request, 403, "The login form expired: try again.", wanted)
        name, password = fields.get("user", ""), fields.get("password", "")
        address = console.client(request)
        device = cookies.device(request.cookies.get(DEVICE_COOKIE))
        attempt = login_attempt(name, address, device)
        wait = await console.throttle.begin(attempt)
        if wait:
            detail = f"Too many failed logins: try again in {wait} s."
            response = error(console, request, 429, "Too Many Requests", detail)
            response.headers["retry-after"] = str(wait)
            return response
        if not console.users.password_matches(name, password):
            log.warning("console: failed login for %r from %s", name[:64], address or "unknown")
            return _login_page(console, request, 401, "Wrong user name or password.", wanted)
        await console.throttle.succeeded(attempt)
        replaced = console.operator(request)
        if replaced is not None:  # the browser's cookie now names the new session only
            await sessions.end(replaced, REPLACED)
        token = await sessions.open(name)
        log.info("console: %s logged in from %s", name, address or "unknown", extra={"user": name})
        response = see_other(safe_next(wanted, f"{CONSOLE_PATH}/events"))
        _set_cookie(console, request, response, SESSION_COOKIE, token, sessions.lifetime)
        _set_cookie(
            console, request, response, DEVICE_COOKIE, cookies.device_cookie(name), DEVICE_LIFETIME
        )
        response.delete_cookie(LOGIN_COOKIE, path=CONSOLE_PATH)
        return response

    async def logout(
        console: Console, request: Request, operator: Operator, fields: Mapping[str, str]
    ) -> Response:
        await sessions.end(operator)
        log.info("console: %s logged out", operator.name, extra={"user": operator.name})
        response = see_other(f"{CONSOLE_PATH}/login")
        response.delete_cookie(SESSION_COOKIE, path=CONSOLE_PATH)
        return response

    async def stylesheet_file(request: Request) -> Response:
        return Response(stylesheet, media_type="text/css")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        detail = {404: "No console page here.", 405: f"{request.method} is not allowed here."}
        response = error(
            console,
            request,
            exc.status_code,
            {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, "Error"),
            detail.get(exc.status_code, str(exc.detail)),
        )
        response.headers.update(exc.headers or {})  # Allow, on a 405
        return response

    routes = [
        Route("/", page(pages.home), methods=["GET"]),
        Route("/login", login_page, methods=["GET", "POST"]),  # one route: a 405 allows both
        Route("/logout", action(logout), methods=["POST"]),
        Route("/events", page(pages.events), methods=["GET"]),
        Route("/events/{event_id}", page(pages.event), methods=["GET"]),
        Route("/events/{event_id}/replay", action(actions.replay_event), methods=["POST"]),
        Route("/deliveries", page(pages.deliveries), methods=["GET"]),
        Route("/deliveries/replay", action(actions.bulk_replay), methods=["POST"]),
        Route(
            "/deliveries/{delivery_id}/replay", action(actions.replay_delivery), methods=["POST"]
        ),
        Route(
            "/deliveries/{delivery_id}/give-up", action(actions.give_up_delivery), methods=["POST"]
        ),
        Route("/destinations", page(pages.destinations), methods=["GET"]),
        Route("/destinations/{name}/enable", action(actions.enable_destination), methods=["POST"]),
        Route(
            "/destinations/{name}/disable", action(actions.disable_destination), methods=["POST"]
        ),
        Route("/counts", data(live.counts_endpoint), methods=["GET"]),
        Route("/quarantine", page(pages.quarantine), methods=["GET"]),
        Route("/quarantine/{rejected_id}", page(pages.rejected), methods=["GET"]),
        Route("/static/console.css", stylesheet_file, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(DatabaseDown, console=console),
            Middleware(SessionCheck, sessions=sessions),
        ],
        exception_handlers={HTTPException: http_error},
    )
    # a redirect to the slash-less URL would be built from the caller's Host header
    app.router.redirect_slashes = False
    return app


def _login_page(
    console: Console, request: Request, status: int, message: str, wanted: str | None
) -> Response:
    cookie, token = console.login_cookies.form_cookie()
    response = console.page(
        request,
        "login.html",
        None,
        status=status,
        token=token,
        message=message,
        next=safe_next(wanted, f"{CONSOLE_PATH}/events"),
    )
    _set_cookie(console, request, response, LOGIN_COOKIE, cookie, LOGIN_FORM_LIFETIME)
    return response


def _set_cookie(
    console: Console,
    request: Request,
    response: Response,
    name: str,
    value: str,
    lifetime: timedelta,
) -> None:
    """Set one of the console's cookies: only for /console, never readable by a script, never
    sent by another site."""
    response.set_cookie(
        name,
        value,
        max_age=int(lifetime.total_seconds()),
        path=CONSOLE_PATH,
        secure=console.cookie_secure(request),
        httponly=True,
        samesite="strict",
    )
