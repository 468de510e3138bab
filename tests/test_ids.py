"""UUIDv7 ids: format, time prefix, order and uniqueness."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from receivers.ids import new_id, new_ids

MOMENT = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def reference_id(now: datetime, random_bits: int) -> str:
    """The id as the bit-level definition builds it."""
    value = ((int(now.timestamp() * 1000) & ((1 << 48) - 1)) << 80) | random_bits
    value = (value & ~(0xF << 76)) | (0x7 << 76)
    value = (value & ~(0x3 << 62)) | (0x2 << 62)
    return str(uuid.UUID(int=value))


def test_ids_are_uuid7_with_the_time_in_front() -> None:
    for text in [*new_ids(MOMENT, 50), new_id(MOMENT)]:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert parsed.int >> 80 == int(MOMENT.timestamp() * 1000)


def test_ids_keep_the_random_bits_the_definition_keeps() -> None:
    for text in new_ids(MOMENT, 200):
        random_bits = uuid.UUID(text).int & ((1 << 80) - 1)
        assert reference_id(MOMENT, random_bits) == text


def test_ids_are_unique_and_sort_by_time() -> None:
    batch = new_ids(MOMENT, 1000)
    assert len(set(batch)) == 1000
    later = new_ids(MOMENT + timedelta(milliseconds=1), 10)
    assert max(batch) < min(later)
    assert new_ids(MOMENT, 0) == []
