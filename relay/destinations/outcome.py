"""The result of one delivery attempt."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

EXCERPT_BYTES = 1024


@dataclass(frozen=True)
class Outcome:
    """What happened when delivering once.

    ``error`` is short and never contains secrets. ``response_excerpt`` is the start of the
    destination's answer (at most ``EXCERPT_BYTES`` bytes, decoded leniently). ``retry_after`` is
    what a 429/503 answer asked for, unclamped (the retry policy bounds it). ``gone`` means the
    destination answered 410: it does not want this (or any) event any more.

    ``down`` tells a failure that says the destination cannot take any message now (no
    connection, a timeout, an answer of overload or unavailability, a broker out of capacity)
    from a failure of this message alone (any other answer): only the first kind counts toward
    the breaker (:func:`relay.delivery.breaker.after_outcome`). Each destination sets it where
    it learns the cause; a failure it cannot place stays ``False``, so that what a message's
    content can provoke never pauses the destination for every other sender's messages.
    """

    ok: bool
    status_code: int | None = None
    error: str | None = None
    response_excerpt: str | None = None
    retry_after: timedelta | None = None
    gone: bool = False
    duration_ms: float = 0.0
    down: bool = False


def excerpt(data: bytes) -> str | None:
    """The first ``EXCERPT_BYTES`` of an answer as text, or None when it is empty. Bytes that
    are not UTF-8, and NUL (which PostgreSQL's text refuses), become U+FFFD."""
    if not data:
        return None
    return data[:EXCERPT_BYTES].decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def elapsed_ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()`` reading): an attempt's
    ``duration_ms``."""
    return (time.perf_counter() - started) * 1000
