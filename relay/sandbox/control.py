"""The control API, for tests and people: under ``/_sandbox/`` (no platform path starts with an
underscore), same apikey. List messages with their callbacks and the receiver's answers, wait for
a message (long-poll), send a callback again, send an inbound SMS, list the magic numbers, reset.
Each callback lists at most the first and the latest of its attempts
(:data:`~relay.sandbox.state.ATTEMPTS_LISTED`), with the count of all."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from receivers.problems import Problem
from relay.sandbox import inbound_sms, numbers
from relay.sandbox.numerals import decimal, whole
from relay.sandbox.sms import report
from relay.sandbox.sms_request import invalid
from relay.sandbox.state import Message, iso
from relay.sandbox.web import authorize, json_response, read_json_object, single_query

if TYPE_CHECKING:
    from relay.sandbox.sandbox import Sandbox

PREFIX = "/_sandbox"
WAIT_DEFAULT_SECONDS = 10.0
WAIT_MAX_SECONDS = 60.0
FILTERS = ("to", "text", "status")
PAGING = ("limit", "offset")
LIMIT_DEFAULT = 100
LIMIT_MAX = 1000
MESSAGE_STATUSES = ("ACCEPTED", "BUFFERED", "DELIVERED", "UNDELIVERABLE", "REJECTED", "EXPIRED")


def message_json(sandbox: Sandbox, message: Message) -> dict[str, Any]:
    """A message as the control API shows it: the platform's view plus the sandbox's."""
    return {
        **report(message, sandbox.base_url),
        "message": message.text,
        "encoding": message.encoding,
        "textParts": message.parts,
        "callbackUrl": message.callback_url,
        "callbackMethod": message.callback_method,
        "sendDateTime": iso(message.send_at),
        "expiresAt": iso(message.expires_at),
        "outcome": message.outcome,
        "chaos": sorted(message.chaos),
        "history": [{"status": s, "at": iso(at)} for s, at in message.history],
        "conversions": message.conversions,
        "conversionCount": message.conversion_count,
        "callbacks": [
            sandbox.state.callbacks[c].as_json()
            for c in message.callbacks
            if c in sandbox.state.callbacks
        ],
    }


def _filters(request: Request) -> dict[str, str]:
    query = single_query(request)
    unknown = set(query) - {*FILTERS, *PAGING, "timeout"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid(name, "is not a filter (to, text, status)")
    status = query.get("status")
    if status is not None and status.upper() not in MESSAGE_STATUSES:
        raise invalid("status", f"is not one of {', '.join(MESSAGE_STATUSES)}")
    return {k: v for k, v in query.items() if k in FILTERS}


def _matches(message: Message, filters: dict[str, str]) -> bool:
    return (
        filters.get("to", message.to) == message.to
        and filters.get("text", "") in message.text
        and filters.get("status", message.status).upper() == message.status
    )


def _whole(request: Request, name: str, default: int, low: int, high: int) -> int:
    """A paging parameter: ASCII digits from ``low`` to ``high`` (``default`` when absent)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = whole(raw)
    except ValueError:
        raise invalid(name, f"must be a whole number from {low} to {high}") from None
    if not low <= value <= high:
        raise invalid(name, f"must be a whole number from {low} to {high}")
    return value


def _timeout(request: Request) -> float:
    raw = request.query_params.get("timeout")
    if raw is None:
        return WAIT_DEFAULT_SECONDS
    try:
        value = decimal(raw)
    except ValueError:
        raise invalid("timeout", "must be a number of seconds") from None
    if not 0 <= value <= WAIT_MAX_SECONDS:
        raise invalid("timeout", f"must be 0 to {WAIT_MAX_SECONDS:g} seconds")
    return value


def control_routes(sandbox: Sandbox) -> list[Route]:
    """The control API's routes for one sandbox."""

    def guarded(endpoint: Any) -> Any:
        async def checked(request: Request) -> Response:
            authorize(request, sandbox.api_key)
            return await endpoint(request)

        return checked

    async def list_messages(request: Request) -> Response:
        filters = _filters(request)
        limit = _whole(request, "limit", LIMIT_DEFAULT, 1, LIMIT_MAX)
        offset = _whole(request, "offset", 0, 0, 10**9)
        matching = [m for m in sandbox.state.messages.values() if _matches(m, filters)]
        page = [message_json(sandbox, m) for m in matching[offset : offset + limit]]
        return json_response(
            {"messages": page, "total": len(matching), "limit": limit, "offset": offset}
        )

    async def wait_for_message(request: Request) -> Response:
        filters = _filters(request)
        timeout = _timeout(request)
        deadline = time.monotonic() + timeout
        while True:
            for message in sandbox.state.messages.values():
                if _matches(message, filters):
                    return json_response(message_json(sandbox, message))
            left = deadline - time.monotonic()
            if left <= 0:
                raise Problem(
                    404,
                    "no-match",
                    "Not Found",
                    f"No message matched within {timeout:g} s.",
                )
            await sandbox.state.wait_for_change(left)

    async def list_callbacks(request: Request) -> Response:
        single_query(request)
        return json_response({"callbacks": [c.as_json() for c in sandbox.state.callbacks.values()]})

    async def resend(request: Request) -> Response:
        callback = sandbox.state.callbacks.get(request.path_params["id"])
        if callback is None:
            raise Problem(404, "not-found", "Not Found", "No callback with this id.")
        sandbox.scheduler.resend(callback)
        return json_response(callback.as_json(), status=202)

    async def inbound(request: Request) -> Response:
        single_query(request)
        if request.method != "POST":
            found = [inbound_sms.inbound_json(sandbox, r) for r in sandbox.state.inbound.values()]
            return json_response({"inbound": found})
        fields = await read_json_object(request)
        parsed = inbound_sms.parse_inbound(fields, sandbox.settings.inbound_number)
        record = inbound_sms.send_inbound(sandbox, parsed)
        return json_response(inbound_sms.inbound_json(sandbox, record), status=202)

    async def reset(request: Request) -> Response:
        sandbox.reset()
        return Response(status_code=204, headers={"cache-control": "no-store"})

    async def magic_numbers(request: Request) -> Response:
        return json_response({"numbers": [n.as_json() for n in numbers.NUMBERS]})

    async def idle(request: Request) -> Response:
        try:
            async with asyncio.timeout(_timeout(request)):
                await sandbox.scheduler.idle()
        except TimeoutError:
            raise Problem(
                503, "busy", "Service Unavailable", "Callbacks are still due or in flight."
            ) from None
        return Response(status_code=204, headers={"cache-control": "no-store"})

    return [
        Route(f"{PREFIX}/messages", guarded(list_messages), methods=["GET"]),
        Route(f"{PREFIX}/messages/wait", guarded(wait_for_message), methods=["GET"]),
        Route(f"{PREFIX}/callbacks", guarded(list_callbacks), methods=["GET"]),
        Route(f"{PREFIX}/callbacks/{{id}}/resend", guarded(resend), methods=["POST"]),
        Route(f"{PREFIX}/inbound", guarded(inbound), methods=["GET", "POST"]),
        Route(f"{PREFIX}/reset", guarded(reset), methods=["POST"]),
        Route(f"{PREFIX}/numbers", guarded(magic_numbers), methods=["GET"]),
        Route(f"{PREFIX}/idle", guarded(idle), methods=["GET"]),
    ]
