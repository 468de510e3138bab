"""What reaches the logs: URL tokens are masked in every line printed, and warnings that any
stranger can trigger at will (a WebSocket or h2c upgrade request, which `relay serve` does not
serve) are dropped, so that nobody can flood the log."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

QUERY_PART = re.compile(r"(?<=[?&;])[^&;#\s]{5,}")
"""A query part long enough to hold a key: ``token`` needs five characters, however encoded."""
MAYBE_TOKEN = re.compile(
    r"[^tT%]*[tT%][^oO%]*[oO%][^kK\u212a%]*[kK\u212a%][^eE%]*[eE%][^nN%]*[nN%]"
)
"""A raw key that may decode to ``token``: each letter is literal or comes from an escape (a
``%``; the Kelvin sign lowercases to ``k``). A quick test without backtracking, so that most
parts are never decoded."""
ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
NOT_ALNUM = re.compile(r"[\W_]+")
MASK = "***"
DECODE_ROUNDS = 5
"""At most this many rounds of percent-decoding when normalizing a key."""


def redact(text: str) -> str:
    """``/hooks/sms/inbound?token=abc`` -> ``/hooks/sms/inbound?token=***``, however the key is
    spelled: percent-encoded (once or more), with ``%3D`` for ``=``, with brackets (``token[]``);
    see `_mask_token`."""
    return QUERY_PART.sub(_mask_token, text)


def _decoded(text: str) -> str:
    """``text`` percent-decoded until it no longer changes, at most ``DECODE_ROUNDS`` times."""
    for _ in range(DECODE_ROUNDS):
        if not ESCAPE.search(text):
            break
        text = unquote(text)
    return text


def _mask_token(part: re.Match[str]) -> str:
    """A query part masked if its key, decoded and stripped of all but letters and digits, is
    ``token``: ``key=***`` if the raw part has an ``=`` that the key does not hide, else ``***``.

    Decoding never joins text across a literal ``=``, so decoding the raw key alone gives the
    decoded part's key (``+`` is left alone: as a space, it would be stripped all the same)."""
    raw = part.group(0)
    key, has_eq, _ = raw.partition("=")
    if not MAYBE_TOKEN.match(key):
        return raw
    decoded = _decoded(key)
    name = decoded.partition("=")[0]
    if NOT_ALNUM.sub("", name.lower()) != "token":
        return raw
    # the raw key is kept unless it hides a value itself (``token%3Dsecret=x`` is masked whole)
    if has_eq and name == decoded:
        return f"{key}={MASK}"
    return MASK


class RedactTokens(logging.Filter):
    """Masks URL tokens in a record's message as it will be printed (its arguments filled
    in, so that a template like ``token=%s`` stays whole). Installed on the handler of
    :func:`relay.logs.configure_logging`, so that it sees every record printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit: printed as logging prints them
            return True
        record.msg, record.args = redact(message), None
        return True


UNSERVED_UPGRADE = ("Unsupported upgrade request", "No supported WebSocket library detected")
"""The starts of uvicorn's warnings for an upgrade request (two per request)."""


class DropUpgradeWarnings(logging.Filter):
    """Drops uvicorn's warnings about upgrade requests: no receiver speaks WebSocket or h2c,
    the request is answered as plain HTTP/1.1, and a client could send thousands a second."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(UNSERVED_UPGRADE))


def install() -> None:
    """Drop uvicorn's upgrade warnings (tokens are masked by the handler's filter)."""
    logging.getLogger("uvicorn.error").addFilter(DropUpgradeWarnings())
