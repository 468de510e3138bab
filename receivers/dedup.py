"""Dedup keys: the identity of an event across the platform's retries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from receivers.kinds import Kind
from receivers.store.records import body_hash

MAX_KEY_LENGTH = 200


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
