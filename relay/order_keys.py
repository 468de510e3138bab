"""Order keys: what a destination with ``ordering = "per-key"`` keeps in order.

An order key is a template over the event, with fields in braces:

- ``platform_id`` (the default, ``"{platform_id}"``): the platform's id of what the event is
  about: ``requestId`` (SMS reports and inbound SMS, number lookups), ``msgid`` (legacy SMS
  reports), ``messageId`` (Conversations), ``callId`` (calls);
- ``kind`` and ``source``: the event's kind and the source that received it;
- ``payload.NAME``: the top-level field ``NAME`` of the callback's payload (``payload.to``).

An event whose template names a field it does not have (absent, empty, or not a single value)
has no key: it is delivered without waiting for any other. A key longer than
:data:`MAX_KEY_LENGTH` characters, or with control characters, is stored as its SHA-256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from string import Formatter
from typing import Any

from receivers.dedup import platform_refs_of

DEFAULT_ORDER_KEY = "{platform_id}"
MAX_KEY_LENGTH = 200
ENVELOPE_FIELDS = ("platform_id", "kind", "source")
PAYLOAD_PREFIX = "payload."


class OrderKey:
    """A parsed order key template; ``ValueError`` says what is wrong with a bad one."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._parts = _parse(text)

    def key(self, kind: str, source: str, payload: Mapping[str, Any]) -> str | None:
        """The key of one event, or None when the event lacks a field the template names."""
        values: list[str] = []
        for literal, field in self._parts:
            values.append(literal)
            if field is None:
                continue
            value = _value(field, kind, source, payload)
            if value is None:
                return None
            values.append(value)
        key = "".join(values)
        if len(key) > MAX_KEY_LENGTH or not key.isprintable():
            return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        return key


def _value(field: str, kind: str, source: str, payload: Mapping[str, Any]) -> str | None:
    if field == "kind":
        return kind
    if field == "source":
        return source
    if field == "platform_id":
        return platform_refs_of(kind, payload)[0]
    value = payload.get(field.removeprefix(PAYLOAD_PREFIX))
    if value is None or isinstance(value, dict | list) or value == "":
        return None
    return str(value)


def _parse(text: str) -> list[tuple[str, str | None]]:
    if not text:
        raise ValueError("cannot be empty")
    try:
        parsed = list(Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a template: {exc}") from None
    parts: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        if field is not None and (spec or conversion):
            raise ValueError(f"{{{field}}}: formats and conversions are not supported")
        if field is not None and not _known(field):
            raise ValueError(
                f"{{{field}}} is not a field: use {{platform_id}}, {{kind}}, {{source}} or "
                "{payload.NAME}"
            )
        parts.append((literal, field))
    return parts


def _known(field: str) -> bool:
    if field in ENVELOPE_FIELDS:
        return True
    name = field.removeprefix(PAYLOAD_PREFIX)
    return field.startswith(PAYLOAD_PREFIX) and name.isidentifier()
