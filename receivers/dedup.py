"""Dedup keys: the identity of an event across the platform's retries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from receivers.kinds import KINDS_BY_NAME, Kind, kind_for
from receivers.store.records import body_hash

MAX_KEY_LENGTH = 200
PLATFORM_ID_LENGTH = 200
EVENT_NAME_LENGTH = 64


def dedup_key(kind: Kind, payload: Mapping[str, Any], raw_body: bytes) -> str:
    """The kind's dedup fields joined, or the body hash when one of them is missing.

    Long keys and keys with control characters are hashed so that any input can be stored.
    """
    parts: list[str] = []
    for name in kind.dedup_fields:
        value = payload.get(name)
        if value is None or value == "" or isinstance(value, dict | list):
            return body_hash(raw_body)
        text = str(value)
        parts.append(text.lower() if name in kind.case_insensitive else text)
    key = "|".join(parts)
    if len(key) > MAX_KEY_LENGTH or not key.isprintable() or any("|" in p for p in parts):
        canonical = json.dumps(parts, ensure_ascii=False).encode("utf-8", "surrogatepass")
        return "sha256:" + hashlib.sha256(canonical).hexdigest()
    return key


def platform_refs(kind: Kind, payload: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """What operators search an event by: the platform's id of what it is about (the kind's
    first dedup field) and its event name (the second, lower-cased), each None when absent or
    not a short printable value."""
    values: list[str | None] = []
    for name, width in zip(
        kind.dedup_fields, (PLATFORM_ID_LENGTH, EVENT_NAME_LENGTH), strict=False
    ):
        value = payload.get(name)
        text = None if value is None or isinstance(value, dict | list) else str(value)
        fits = text is not None and 0 < len(text) <= width and text.isprintable()
        values.append(text if fits else None)
    platform_id = values[0] if values else None
    event_name = values[1].lower() if len(values) > 1 and values[1] else None
    return platform_id, event_name


def platform_refs_of(kind_name: str, payload: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """:func:`platform_refs` of a stored event, by its kind's name: the row its payload matches
    (a legacy SMS report's ``msgid`` and ``stat``), both None for an unknown kind."""
    if kind_name not in KINDS_BY_NAME:
        return None, None
    return platform_refs(kind_for(kind_name, payload), payload)
