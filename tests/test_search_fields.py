"""Each event's platform id and event name: taken at ingest, and filled in for stored events
by the migration that added them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from receivers.dedup import platform_refs
from receivers.kinds import kind_for
from receivers.store import create_engine
from relay.store import migrate


@pytest.mark.parametrize(
    ("kind", "payload", "expected"),
    [
        ("sms.inbound", {"requestId": "r-1"}, ("r-1", None)),
        ("sms.dlr", {"requestId": "r-1", "status": "DELIVERED"}, ("r-1", "delivered")),
        ("sms.dlr", {"msgid": "m-9", "stat": "Delivered"}, ("m-9", "delivered")),
        (
            "conversations.status",
            {"messageId": "c", "event": "MessageStatus::SEEN"},
            ("c", "messagestatus::seen"),
        ),
        ("tts.event", {"callId": 42, "status": "answered"}, ("42", "answered")),
        ("sms.dlr", {"requestId": "", "status": "x" * 65}, (None, None)),
        ("sms.dlr", {"requestId": "x" * 201, "status": {"a": 1}}, (None, None)),
        ("sms.inbound", {"requestId": "a\nb"}, (None, None)),
        ("numinfo.gnp", {}, (None, None)),
    ],
)
def test_platform_refs(
    kind: str, payload: dict[str, object], expected: tuple[str | None, str | None]
) -> None:
    assert platform_refs(kind_for(kind, payload), payload) == expected


async def test_the_migration_fills_in_stored_events(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    try:
        await migrate.upgrade(engine, "0003")
        moment = datetime(2026, 11, 1, tzinfo=UTC).replace(tzinfo=None)
        async with engine.begin() as conn:
            for number, key in enumerate(["r-1", "r-2|delivered", "sha256:ab", "m|x|y"]):
                await conn.execute(
                    text(
                        "INSERT INTO received_events (id, source, kind, dedup_key, received_at, "
                        "payload, raw_body, method, duplicates) VALUES "
                        "(:id, 'default', 'sms.dlr', :key, :at, '{}', x'7b7d', 'POST', 0)"
                    ),
                    {"id": f"id-{number}", "key": key, "at": moment},
                )
        await migrate.upgrade(engine)
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT id, platform_id, event_name FROM received_events ORDER BY id")
            )
            assert [tuple(row) for row in rows] == [
                ("id-0", "r-1", None),
                ("id-1", "r-2", "delivered"),
                ("id-2", None, None),
                ("id-3", "m", "x|y"),
            ]
    finally:
        await engine.dispose()
