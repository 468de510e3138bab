"""The console's list indexes: one per filter, each ending in the list's order (time, then id),
so that every list page and every filter reads its 50 rows straight off an index, newest first,
and a page cursor is a range of that index (``relay.console.queries``).

Building them reads each table once: at 1,000,000 events and as many deliveries, 32 s on SQLite
and 24 s on PostgreSQL on a busy 2-core machine (docs/performance.md); on SQLite the listed
index reads every body once (9 s for 2,100 events of 1 MiB). SQLite migrates when `relay serve`
starts, so the start waits for it and logs a line before and after.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

log = logging.getLogger("relay.migrate")

REPLACED = (
    # (table, name, columns before, columns now)
    ("received_events", "ix_received_events_received_at", ["received_at"], ["received_at", "id"]),
    (
        "received_events",
        "ix_received_events_kind_event",
        ["kind", "event_name", "received_at"],
        ["kind", "event_name", "received_at", "id"],
    ),
    (
        "received_events",
        "ix_received_events_source",
        ["source", "received_at"],
        ["source", "received_at", "id"],
    ),
    (
        "received_events",
        "ix_received_events_platform_id",
        ["platform_id"],
        ["platform_id", "received_at", "id"],
    ),
    (
        "deliveries",
        "ix_deliveries_status_created",
        ["status", "created_at"],
        ["status", "created_at", "id"],
    ),
    (
        "deliveries",
        "ix_deliveries_destination_status",
        ["destination", "status", "created_at"],
        ["destination", "status", "created_at", "id"],
    ),
    (
        "rejected_bodies",
        "ix_rejected_bodies_last_seen_at",
        ["last_seen_at"],
        ["last_seen_at", "id"],
    ),
)
LISTED = (
    "received_events",
    "ix_received_events_listed",
    ["id", "source", "kind", "event_name", "platform_id", "received_at", "duplicates"],
)
"""SQLite only: what the lists show of an event, by id. SQLite keeps a row's columns in their
declared order, so those after the payload and the raw body (the platform id, the event name,
the duplicates) lie at the end of the body's overflow pages: this index lets a list read them
without reading the body. PostgreSQL stores large values apart (TOAST) and needs none."""
ADDED = (
    ("received_events", "ix_received_events_kind", ["kind", "received_at", "id"]),
    ("received_events", "ix_received_events_event", ["event_name", "received_at", "id"]),
    ("deliveries", "ix_deliveries_created", ["created_at", "id"]),
    ("deliveries", "ix_deliveries_destination_created", ["destination", "created_at", "id"]),
)


def upgrade() -> None:
    conn = op.get_bind()
    events = conn.scalar(sa.text("SELECT count(*) FROM received_events"))
    deliveries = conn.scalar(sa.text("SELECT count(*) FROM deliveries"))
    noticeable = bool(events or deliveries)  # a new database builds them in no time: no lines
    if noticeable:
        log.info(
            "building the console's list indexes over %d events and %d deliveries "
            "(about half a minute per million rows)",
            events,
            deliveries,
        )
    started = time.monotonic()
    for table, name, _, columns in REPLACED:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns)
    for table, name, columns in ADDED:
        op.create_index(name, table, columns)
    if conn.dialect.name == "sqlite":
        op.create_index(LISTED[1], LISTED[0], LISTED[2])
    if noticeable:
        log.info("built the console's list indexes in %.1f s", time.monotonic() - started)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index(LISTED[1], table_name=LISTED[0])
    for table, name, _ in reversed(ADDED):
        op.drop_index(name, table_name=table)
    for table, name, columns, _ in reversed(REPLACED):
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns)
