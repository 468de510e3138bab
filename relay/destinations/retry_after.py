"""Parsing the ``Retry-After`` header (delta-seconds or HTTP-date), leniently and boundedly."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

MAX_HEADER_LENGTH = 64
DELTA_SECONDS = re.compile(r"\d{1,10}")


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> timedelta | None:
    """How long the server asked to wait; None for a missing or unparseable value.

    Delta-seconds are taken as given; an HTTP-date is turned into the time left until it (zero
    when it is already past). Over-long values and numbers of more than 10 digits are ignored.
    """
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_HEADER_LENGTH:
        return None
    if DELTA_SECONDS.fullmatch(value):
        return timedelta(seconds=int(value))
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:  # "-0000": HTTP-dates are always GMT
        moment = moment.replace(tzinfo=UTC)
    left = moment - (now or datetime.now(UTC))
    return max(left, timedelta(0))
