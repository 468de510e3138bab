"""The sandbox's Starlette app: the platform's SMS routes (apikey auth, chaos), the control API
under ``/_sandbox/``, and RFC 7807 problems for everything refused."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from receivers.problems import Problem
from relay.sandbox import sms
from relay.sandbox.control import control_routes
from relay.sandbox.page import page_routes
from relay.sandbox.products import product_routes
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.sms_request import invalid, parse_sms
from relay.sandbox.state import CONVERSIONS_KEPT
from relay.sandbox.web import (
    authorize,
    forced_chaos,
    json_response,
    read_json_object,
    single_query,
)

Endpoint = Callable[[Request], Awaitable[Response]]
log = logging.getLogger(__name__)


def build_app(sandbox: Sandbox) -> Starlette:
    """The sandbox's ASGI app; its lifespan runs the sandbox's scheduler."""

    def platform(endpoint: Callable[[Request, frozenset[str]], Awaitable[Response]]) -> Endpoint:
        """Auth, then the request's chaos: an API error instead of the answer, or the chaos
        its callbacks get."""

        async def guarded(request: Request) -> Response:
            if request.method == "HEAD":  # Starlette adds HEAD to GET routes; a HEAD sends nothing
                raise HTTPException(405, headers={"Allow": "GET, POST"})
            authorize(request, sandbox.api_key)
            forced = forced_chaos(request)
            api = sandbox.draw_chaos(forced, api=True)
            if "api-429" in api:
                raise Problem(
                    429,
                    "too-many-requests",
                    "Too Many Requests",
                    "Sandbox chaos: the rate limit was hit; retry later.",
                    headers={"Retry-After": str(sandbox.settings.chaos.retry_after)},
                )
            if "api-500" in api:
                raise Problem(
                    500, "internal-error", "Internal Server Error", "Sandbox chaos: a failure."
                )
            return await endpoint(request, forced)

        return guarded

    async def send(request: Request, forced: frozenset[str]) -> Response:
        if request.method == "POST":
            fields: dict[str, object] = await read_json_object(request)
        else:
            fields = dict(single_query(request))
        parsed = parse_sms(fields, sandbox.clock.now())
        message = sms.send_sms(sandbox, parsed, sandbox.draw_chaos(forced, api=False))
        return json_response(sms.report(message, sandbox.base_url))

    async def status(request: Request, forced: frozenset[str]) -> Response:
        message = sandbox.state.messages.get(request.path_params["requestId"])
        if message is None:
            raise _unknown_message()
        return json_response(sms.report(message, sandbox.base_url))

    async def conversion(request: Request, forced: frozenset[str]) -> Response:
        fields = await read_json_object(request)
        request_id = fields.get("requestId")
        if not isinstance(request_id, str) or not request_id:
            raise invalid("requestId", "is required (a string)")
        delivered = fields.get("delivered", True)
        if not isinstance(delivered, bool):
            raise invalid("delivered", "must be true or false")
        timestamp = fields.get("timestamp")
        if timestamp is not None and not (isinstance(timestamp, str) and _is_datetime(timestamp)):
            raise invalid("timestamp", "must be an ISO 8601 date-time")
        message = sandbox.state.messages.get(request_id)
        if message is None:
            raise _unknown_message()
        message.conversions.append(
            {
                "delivered": delivered,
                "timestamp": timestamp or sandbox.clock.now().isoformat(),
            }
        )
        del message.conversions[:-CONVERSIONS_KEPT]
        message.conversion_count += 1
        sandbox.state.changed()
        return Response(status_code=200, headers={"cache-control": "no-store"})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with sandbox:
            yield

    routes = [
        Route("/messaging/v1/sms", platform(send), methods=["GET", "POST"]),
        Route("/messaging/v1/messages/{requestId}", platform(status), methods=["GET"]),
        Route("/messaging/v1/conversion", platform(conversion), methods=["POST"]),
        *control_routes(sandbox),
        *product_routes(sandbox, platform),
        *page_routes(sandbox),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            Problem: _problem,
            ClientDisconnect: _client_gone,
            HTTPException: _http_problem,
            Exception: _server_problem,
        },
    )
    app.router.redirect_slashes = False
    return app


def _unknown_message() -> Problem:
    return Problem(404, "not-found", "Not Found", "No message with this requestId.")


def _is_datetime(value: str) -> bool:
    try:
        datetime.fromisoformat(value).astimezone(UTC)
    except (ValueError, OverflowError):
        return False
    return len(value) <= 64


async def _problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return exc.response()


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client left before its body was read: a closed request, not a server error (no
    traceback); the answer goes nowhere."""
    return Response(status_code=400, headers={"connection": "close"})


async def _http_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return Problem(404, "not-found", "Not Found", "Nothing is served at this path.").response()
    if exc.status_code == 405:
        return Problem(
            405,
            "method-not-allowed",
            "Method Not Allowed",
            f"{request.method} is not accepted at {request.url.path}.",
            headers=dict(exc.headers or {}),
        ).response()
    return Problem(exc.status_code, "error", "Error", str(exc.detail)).response()


async def _server_problem(request: Request, exc: Exception) -> Response:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return Problem(
        500, "internal-error", "Internal Server Error", "An unexpected error occurred."
    ).response()
