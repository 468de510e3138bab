"""The HTTP side shared by the sandbox's routes: the apikey check, the chaos header, JSON in and
out. Everything refused is an RFC 7807 problem."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from receivers.problems import Problem
from relay.sandbox.settings import CHAOS_NAMES

MAX_BODY = 64 * 1024
CHAOS_HEADER = "x-sandbox-chaos"
MAX_CHAOS_HEADER = 200
SAFE_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


def json_response(document: Any, status: int = 200) -> Response:
    """A JSON answer (UTF-8, not cached)."""
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(body, status, media_type="application/json", headers=SAFE_HEADERS)


def authorize(request: Request, api_key: str) -> None:
    """Exactly one ``apikey`` header holding the key (compared in constant time), else 401."""
    given = request.headers.getlist("apikey")
    if len(given) != 1 or not hmac.compare_digest(given[0].encode(), api_key.encode()):
        raise Problem(
            401,
            "unauthorized",
            "Unauthorized",
            "Send the sandbox's API key, once, in the apikey header.",
            headers={"www-authenticate": "apikey"},
        )


def forced_chaos(request: Request) -> frozenset[str]:
    """The chaos names of the ``X-Sandbox-Chaos`` header (comma-separated; repeatable)."""
    values = request.headers.getlist(CHAOS_HEADER)
    text = ",".join(values)
    if len(text) > MAX_CHAOS_HEADER:
        raise _bad_chaos(f"is longer than {MAX_CHAOS_HEADER} characters")
    names = {name.strip().lower() for name in text.split(",") if name.strip()}
    unknown = names - set(CHAOS_NAMES)
    if unknown:
        raise _bad_chaos(
            f"unknown chaos {', '.join(sorted(map(repr, unknown)))}; "
            f"known: {', '.join(CHAOS_NAMES)}"
        )
    if values and not names:
        raise _bad_chaos("names no chaos")
    return frozenset(names)


def _bad_chaos(message: str) -> Problem:
    return Problem(
        400,
        "invalid-request",
        "Bad Request",
        f"X-Sandbox-Chaos: {message}",
        errors=[{"field": "X-Sandbox-Chaos", "message": message}],
    )


def bad_body(message: str) -> Problem:
    """The 400 problem for a body that is not what the operation reads."""
    return Problem(
        400,
        "invalid-request",
        "Bad Request",
        f"body: {message}",
        errors=[{"field": "(body)", "message": message}],
    )


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object: 413 over :data:`MAX_BODY` bytes, 400 when it is
    not UTF-8 JSON or not an object."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise _too_large()
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise _too_large()
    if not body.strip():
        raise bad_body("is empty; send a JSON object")
    try:
        document = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_body("is not UTF-8") from None
    except (ValueError, RecursionError):  # ValueError: an integer over 4,300 digits too
        raise bad_body("is not JSON") from None
    if not isinstance(document, dict):
        raise bad_body("is not a JSON object")
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad_body("holds an unpaired surrogate escape (not text)") from None
    return document


def single_query(request: Request) -> dict[str, str]:
    """The query parameters, each given at most once (400 naming a repeated one)."""
    fields: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in fields:
            raise Problem(
                400,
                "invalid-request",
                "Bad Request",
                f"{name}: given more than once",
                errors=[{"field": name, "message": "given more than once"}],
            )
        fields[name] = value
    return fields


def _too_large() -> Problem:
    return Problem(
        413, "body-too-large", "Content Too Large", f"The body exceeds {MAX_BODY} bytes."
    )
