"""The routes of number information (``/nis/v1/gnp``, ``/nis/v1/gnv``) and text-to-speech
(``/tts/v1/calls``), and the control API's lists of lookups and calls."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from receivers.problems import Problem
from relay.sandbox import lookups, tts
from relay.sandbox.control import PREFIX
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.web import authorize, json_response, read_json_object, single_query

PlatformEndpoint = Callable[[Request, frozenset[str]], Awaitable[Response]]
Guard = Callable[[PlatformEndpoint], Callable[[Request], Awaitable[Response]]]
"""The app's wrapper of a platform route: apikey, then the request's chaos."""


def product_routes(sandbox: Sandbox, platform: Guard) -> list[Route]:
    """The routes for one sandbox; ``platform`` guards the platform's ones."""

    def lookup_of(product: str) -> PlatformEndpoint:
        async def endpoint(request: Request, forced: frozenset[str]) -> Response:
            fields = single_query(request)
            chaos = sandbox.draw_chaos(forced, api=False)
            return json_response(lookups.lookup(sandbox, product, fields, chaos))

        return endpoint

    async def start_call(request: Request, forced: frozenset[str]) -> Response:
        parsed = tts.parse_call(await read_json_object(request))
        call = tts.start_call(sandbox, parsed, sandbox.draw_chaos(forced, api=False))
        return json_response(tts.response(call))

    async def call_events(request: Request, forced: frozenset[str]) -> Response:
        call = sandbox.state.calls.get(_uuid(request.path_params["callId"]))
        if call is None:
            raise Problem(404, "not-found", "Not Found", "No call with this callId.")
        return json_response(call.events)

    def control(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[..., object]:
        async def checked(request: Request) -> Response:
            authorize(request, sandbox.api_key)
            single_query(request)
            return await endpoint(request)

        return checked

    async def list_lookups(request: Request) -> Response:
        found = [lookups.lookup_json(sandbox, r) for r in sandbox.state.lookups.values()]
        return json_response({"lookups": found})

    async def list_calls(request: Request) -> Response:
        found = [tts.call_json(sandbox, c) for c in sandbox.state.calls.values()]
        return json_response({"calls": found})

    return [
        Route("/nis/v1/gnp", platform(lookup_of("gnp")), methods=["GET"]),
        Route("/nis/v1/gnv", platform(lookup_of("gnv")), methods=["GET"]),
        Route("/tts/v1/calls", platform(start_call), methods=["POST"]),
        Route("/tts/v1/calls/{callId}/events", platform(call_events), methods=["GET"]),
        Route(f"{PREFIX}/lookups", control(list_lookups), methods=["GET"]),
        Route(f"{PREFIX}/calls", control(list_calls), methods=["GET"]),
    ]


def _uuid(value: str) -> str:
    """A callId in its canonical form, or "" when it is no UUID (then nothing matches)."""
    try:
        return str(uuid.UUID(value)) if len(value) <= 64 else ""
    except ValueError:
        return ""
