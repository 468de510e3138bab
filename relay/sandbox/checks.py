"""Field checks shared by the number information and text-to-speech requests: each refusal is
the 400 problem naming the field (:func:`relay.sandbox.sms_request.invalid`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relay.sandbox.settings import http_url
from relay.sandbox.sms_request import INTERNATIONAL, MAX_URL, invalid, string_field


def international(fields: Mapping[str, Any], name: str) -> str:
    """A required number in international format (``+`` and 7 to 15 digits)."""
    value = string_field(fields, name, required=True) or ""
    if not INTERNATIONAL.fullmatch(value):
        raise invalid(name, "must be a number in international format (+ and 7 to 15 digits)")
    return value


def callback_url(fields: Mapping[str, Any], name: str) -> str | None:
    """An optional http(s) URL with a host (empty: none)."""
    value = string_field(fields, name)
    if value is None:
        return None
    if len(value) > MAX_URL:
        raise invalid(name, f"has more than {MAX_URL} characters")
    try:
        http_url(value)
    except ValueError as exc:
        raise invalid(name, str(exc)) from None
    return value
