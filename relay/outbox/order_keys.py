"""Order keys: what a destination with ``ordering = "per-key"`` keeps in order.

An order key is a template over the event, with fields in braces:

- ``platform_id`` (the default, ``"{platform_id}"``): the platform's id of what the event is
  about: ``requestId`` (SMS reports and inbound SMS, number lookups), ``msgid`` (legacy SMS
  reports), ``messageId`` (Conversations), ``callId`` (calls);
- ``kind`` and ``source``: the event's kind and the source that received it;
- ``payload.NAME``: the top-level field ``NAME`` of the callback's payload (``payload.to``).

A string value goes into the key as it is, a number or a boolean as its JSON text (``true``,
``1.5e+308``). An event whose template names a field it does not have (absent, null, empty, an
object or an array) has no key: it is delivered without waiting for any other. A key longer
than :data:`MAX_KEY_LENGTH` characters, or with characters that are not printable, is stored as
its SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from receivers.kinds import KINDS_BY_NAME, kind_for
from relay.outbox.template_parts import template_parts

DEFAULT_ORDER_KEY = "{platform_id}"
MAX_KEY_LENGTH = 200
ENVELOPE_FIELDS = ("platform_id", "kind", "source")
PAYLOAD_PREFIX = "payload."
FIELDS_ALLOWED = "{platform_id}, {kind}, {source} or {payload.NAME}"


class OrderKey:
    """A parsed order key template; ``ValueError`` says what is wrong with a bad one."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._parts = template_parts(text, _known, FIELDS_ALLOWED)

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
        if kind not in KINDS_BY_NAME:
            return None
        return _text(payload.get(kind_for(kind, payload).dedup_fields[0]))
    return _text(payload.get(field.removeprefix(PAYLOAD_PREFIX)))


def _text(value: Any) -> str | None:
    """A field's value as key text: a string as it is, a number or boolean as its JSON text;
    None for null, the empty string, an object or an array (no key)."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return None


def _known(field: str) -> bool:
    if field in ENVELOPE_FIELDS:
        return True
    name = field.removeprefix(PAYLOAD_PREFIX)
    return field.startswith(PAYLOAD_PREFIX) and name.isidentifier()
