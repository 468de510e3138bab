"""Reading and decoding request bodies, within the size limit."""

from __future__ import annotations

import json
import re
import sys
from typing import Any
from urllib.parse import unquote_to_bytes

from pydantic_core import from_json
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from receivers.problems import Problem

MAX_JSON_DEPTH = 64
MAX_JSON_CONTAINERS = 2048
"""The most objects and arrays one body may hold: a 255-part delivery report has 256. It bounds
the work of validating a body (a 1 MiB body of 349,000 empty ``parts`` took 1.7 s)."""
JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
"""A JSON string literal, escapes included (matched in linear time)."""
BRACKETS = re.compile(r"[\[\]{}]")


class BodyTooLarge(Problem):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413, "body-too-large", "Payload Too Large", f"The body exceeds {limit} bytes."
        )


class Undecodable(Problem):
    """The body is not JSON (or not UTF-8): answered 400 and quarantined."""

    def __init__(self, detail: str) -> None:
        super().__init__(400, "undecodable-body", "Bad Request", detail)


async def read_body(receive: Receive, declared: bytes | None, limit: int) -> bytes:
    """The raw body from the ASGI ``receive`` channel, refusing anything over ``limit`` bytes
    whatever ``declared`` (the Content-Length header) says."""
    if declared is not None:
        try:
            if int(declared.decode("latin-1")) > limit:
                raise BodyTooLarge(limit)
        except ValueError:
            raise Problem(
                400, "bad-content-length", "Bad Request", "Content-Length is not a number."
            ) from None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(limit)
            if not message.get("more_body", False):
                if not chunks:
                    return bytes(chunk)
                chunks.append(chunk)
                return b"".join(chunks)
            chunks.append(chunk)
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


def decode_json(raw: bytes) -> Any:
    """The body's JSON value; :class:`Undecodable` when the bytes are not UTF-8 JSON (a value
    that is not an object is the caller's 422, since it fits no model)."""
    if not raw.strip():
        raise Undecodable("The body is empty; a JSON object was expected.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Undecodable(f"The body is not UTF-8 (byte {exc.start}).") from None
    _check_structure(text)
    try:
        return from_json(raw, allow_inf_nan=True)  # jiter: the same values, twice as fast
    except ValueError:
        pass  # json decides, and words the error (it also takes a few bodies jiter refuses)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Undecodable(f"The body is not JSON: {_reason(exc)}.") from None
    return value


def _reason(exc: ValueError | RecursionError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "too deep"
    return f"a number has more than {sys.get_int_max_str_digits()} digits"


def query_as_payload(
    query_string: bytes, structured: frozenset[str], *, leave_out: str
) -> dict[str, Any]:
    """GET callbacks: the query parameters (less ``leave_out``, the token) as a payload; the
    ``structured`` ones (lists such as contentList or parts) are decoded when they carry JSON.

    :class:`Undecodable` when a parameter is not UTF-8 once percent-decoded (a POST body that
    is not UTF-8 is refused the same way), or is given more than once (which one the platform
    meant would be a guess)."""
    payload: dict[str, Any] = {}
    for pair in query_string.split(b"&"):
        if not pair:
            continue
        key_bytes, _, value_bytes = pair.partition(b"=")
        try:
            key, value = _unquote(key_bytes).decode("utf-8"), _unquote(value_bytes).decode("utf-8")
        except UnicodeDecodeError:
            raise Undecodable("A query parameter is not UTF-8 once percent-decoded.") from None
        if key == leave_out:
            continue
        if key in payload:
            raise Undecodable(f"The query parameter {key[:64]!r} is given more than once.")
        stripped = value.strip()
        if key in structured and stripped[:1] in "[{":
            try:
                payload[key] = json.loads(stripped)
                continue
            except (ValueError, RecursionError):  # not JSON (or a number too long): as sent
                pass
        payload[key] = value
    return payload


def query_without(query_string: bytes, name: str) -> bytes:
    """The raw query string, byte for byte, less the parameter ``name`` however its key is
    encoded (the token: a secret is never stored)."""
    unwanted = name.encode()
    pairs = query_string.split(b"&")
    return b"&".join(pair for pair in pairs if _unquote(pair.partition(b"=")[0]) != unwanted)


def _unquote(part: bytes) -> bytes:
    """A query key or value as the bytes it stands for (``+`` is a space)."""
    return unquote_to_bytes(part.replace(b"+", b" "))


def _check_structure(text: str) -> None:
    """:class:`Undecodable` when the JSON text holds more than :data:`MAX_JSON_CONTAINERS`
    objects and arrays or nests them deeper than :data:`MAX_JSON_DEPTH`, so that hostile bodies
    are refused before the parser and the validator see them. Brackets inside strings do not
    count; the strings are only looked at when there are enough brackets to matter."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    structure = JSON_STRING.sub("", text)
    containers = structure.count("[") + structure.count("{")
    if containers > MAX_JSON_CONTAINERS:
        raise Undecodable(
            f"The JSON holds more than {MAX_JSON_CONTAINERS} objects and arrays ({containers})."
        )
    if containers <= MAX_JSON_DEPTH:
        return
    depth = deepest = 0
    for char in BRACKETS.findall(structure):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    if deepest > MAX_JSON_DEPTH:
        raise Undecodable(f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels.")
