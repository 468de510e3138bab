"""Time-ordered unique ids (UUID version 7) for stored rows."""

from __future__ import annotations

import os
import uuid
from datetime import datetime


def new_id(now: datetime) -> str:
    """A UUIDv7 string: 48 bits of Unix milliseconds, then random bits; sorts by time."""
    millis = int(now.timestamp() * 1000) & ((1 << 48) - 1)
    random_bits = int.from_bytes(os.urandom(10), "big")
    value = (millis << 80) | random_bits
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))
