"""An SMS send request, from a JSON body (POST) or query parameters (GET), checked field by field.

Every refusal is a 400 problem naming the field (``errors: [{field, message}]``), never a 500.
Fields not listed here are ignored, as the platform's further fields are not published.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from receivers.problems import Problem
from relay.sandbox.numerals import decimal, whole
from relay.sandbox.segments import Segmented, segment
from relay.sandbox.settings import INTERNATIONAL, http_url

ALPHANUMERIC = re.compile(r"[A-Za-z0-9 ._&-]{1,11}")
MAX_TEXT = 10_000
"""Characters; longer texts are refused (the platform's bound is not published)."""
MAX_URL = 2_000
MAX_REFERENCE = 255
MAX_PART_LIMIT = MAX_TEXT
"""No text has more parts than characters."""
MAX_VALIDITY_MINUTES = 43_200
"""30 days (an assumption: the platform's bound is not published)."""
BOOLEANS = ("conversion", "upperCased", "keepEmojis", "flash")
FRACTIONS = ("trate", "mrate")


@dataclass(frozen=True)
class SmsRequest:
    """A checked send request."""

    to: str
    sender: str
    text: str
    segmented: Segmented
    reference: str | None
    callback_url: str | None
    callback_method: str
    validity: timedelta | None
    send_at: datetime | None
    flash: bool


def invalid(field: str, message: str) -> Problem:
    """The 400 problem for one bad field."""
    return Problem(
        400,
        "invalid-request",
        "Bad Request",
        f"{field}: {message}",
        errors=[{"field": field, "message": message}],
    )


def string_field(fields: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    """A string field; missing or empty is None (or 400 when ``required``)."""
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise invalid(name, "is required")
        return None
    if not isinstance(value, str):
        raise invalid(name, "must be a string")
    return value


def _boolean(fields: Mapping[str, Any], name: str) -> bool | None:
    value = fields.get(name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise invalid(name, "must be true or false")


def _number(fields: Mapping[str, Any], name: str, *, integer: bool) -> float | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    expected = "must be a whole number" if integer else "must be a number"
    if isinstance(value, bool):
        raise invalid(name, expected)
    if isinstance(value, str):
        try:
            value = whole(value) if integer else decimal(value)
        except ValueError:
            raise invalid(name, expected) from None
    if not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise invalid(name, expected)
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid(name, "must be a finite number")
    return value


def _number_field(name: str, value: str) -> str:
    if not INTERNATIONAL.fullmatch(value):
        raise invalid(name, "must be a number in international format (+ and 7 to 15 digits)")
    return value


def parse_sms(fields: Mapping[str, Any], now: datetime) -> SmsRequest:
    """Check a send request's fields; raise the 400 :class:`Problem` of the first bad one."""
    to = _number_field("to", string_field(fields, "to", required=True) or "")
    sender = string_field(fields, "from", required=True) or ""
    if sender.startswith("+") or sender.isdigit():
        _number_field("from", sender)
    elif len(sender) > 11:
        raise invalid("from", "an alphanumeric sender has at most 11 characters")
    elif not ALPHANUMERIC.fullmatch(sender):
        raise invalid("from", "an alphanumeric sender has letters, digits, space and . _ & -")
    text = string_field(fields, "message", required=True) or ""
    if len(text) > MAX_TEXT:
        raise invalid("message", f"has more than {MAX_TEXT} characters")
    try:
        segmented = segment(text, string_field(fields, "encoding") or "AUTO")
    except ValueError as exc:
        raise invalid("encoding", str(exc)) from None
    limit = _number(fields, "partLimit", integer=True)
    if limit is not None and not 1 <= limit <= MAX_PART_LIMIT:
        raise invalid("partLimit", f"must be 1 to {MAX_PART_LIMIT}")
    if limit is not None and len(segmented.parts) > limit:
        raise invalid(
            "partLimit", f"the message needs {len(segmented.parts)} parts, the limit is {limit}"
        )
    callback_url = string_field(fields, "callbackUrl")
    if callback_url is not None:
        if len(callback_url) > MAX_URL:
            raise invalid("callbackUrl", f"has more than {MAX_URL} characters")
        try:
            http_url(callback_url)
        except ValueError as exc:
            raise invalid("callbackUrl", str(exc)) from None
    method = (string_field(fields, "callbackMethod") or "POST").upper()
    if method not in ("POST", "GET"):
        raise invalid("callbackMethod", "must be POST or GET")
    reference = string_field(fields, "reference")
    if reference is not None and len(reference) > MAX_REFERENCE:
        raise invalid("reference", f"has more than {MAX_REFERENCE} characters")
    minutes = _number(fields, "validity", integer=True)
    if minutes is not None and not 1 <= minutes <= MAX_VALIDITY_MINUTES:
        raise invalid("validity", f"must be 1 to {MAX_VALIDITY_MINUTES} minutes")
    for name in FRACTIONS:
        fraction = _number(fields, name, integer=False)
        if fraction is not None and not 0 <= fraction <= 1:
            raise invalid(name, "must be a decimal from 0 to 1")
    flags = {name: _boolean(fields, name) for name in BOOLEANS}
    string_field(fields, "gateway")
    return SmsRequest(
        to=to,
        sender=sender,
        text=text,
        segmented=segmented,
        reference=reference,
        callback_url=callback_url,
        callback_method=method,
        validity=None if minutes is None else timedelta(minutes=minutes),
        send_at=_send_at(string_field(fields, "sendDateTime"), now),
        flash=bool(flags["flash"]),
    )


def _send_at(value: str | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    if len(value) > 64:
        raise invalid("sendDateTime", "is not an ISO 8601 date-time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise invalid("sendDateTime", "is not an ISO 8601 date-time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment <= now:
        raise invalid("sendDateTime", "must be in the future")
    if moment - now > timedelta(days=365):
        raise invalid("sendDateTime", "must be within a year")
    return moment
