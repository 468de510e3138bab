"""Time-ordered unique ids (UUID version 7) for stored rows.

Hand-written because the ids take the time of the store's clock (the arrival time it stamps on
the row, injected in tests), which no library at hand accepts: ``uuid-utils`` 1.2.0 is faster
(0.23 against 0.49 µs per id in batches of 16) but its ``uuid7()`` reads the system clock, and
``uuid6`` is slower (3.5 µs). The standard library has ``uuid7`` from Python 3.14."""

from __future__ import annotations

import os
import re
from datetime import datetime

ID_FORMAT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""What a stored row's id looks like: a UUID's canonical text, lower case."""
MILLIS_MASK = (1 << 48) - 1
RANDOM_HEX_DIGITS = 20  # 80 bits, of which the version and variant take 6
VARIANT_DIGIT = {digit: "89ab"[int(digit, 16) & 0x3] for digit in "0123456789abcdef"}
"""The random hex digit that carries the RFC 4122 variant (binary 10xx) -> that digit."""


def new_id(now: datetime) -> str:
    """A UUIDv7 string: 48 bits of Unix milliseconds, then random bits; sorts by time."""
    return new_ids(now, 1)[0]


def new_ids(now: datetime, count: int) -> list[str]:
    """``count`` UUIDv7 strings for the same moment, from one read of random bytes."""
    millis = f"{int(now.timestamp() * 1000) & MILLIS_MASK:012x}"
    time_part = f"{millis[:8]}-{millis[8:]}-7"
    randomness = os.urandom(RANDOM_HEX_DIGITS // 2 * count).hex()
    ids = []
    for start in range(0, RANDOM_HEX_DIGITS * count, RANDOM_HEX_DIGITS):
        r = randomness[start : start + RANDOM_HEX_DIGITS]
        ids.append(f"{time_part}{r[1:4]}-{VARIANT_DIGIT[r[4]]}{r[5:8]}-{r[8:]}")
    return ids
