"""What the console searches and pages by: each event's platform id and event name, and the
indexes of its lists (keyset pagination, newest first).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BACKFILL_BATCH = 1000


def upgrade() -> None:
    with op.batch_alter_table("received_events") as batch:
        batch.add_column(sa.Column("platform_id", sa.String(200), nullable=True))
        batch.add_column(sa.Column("event_name", sa.String(64), nullable=True))
    _backfill()
    op.drop_index("ix_received_events_kind", table_name="received_events")
    op.create_index(
        "ix_received_events_kind_event", "received_events", ["kind", "event_name", "received_at"]
    )
    op.create_index("ix_received_events_source", "received_events", ["source", "received_at"])
    op.create_index("ix_received_events_platform_id", "received_events", ["platform_id"])
    op.create_index("ix_rejected_bodies_last_seen_at", "rejected_bodies", ["last_seen_at"])
    op.drop_index("ix_deliveries_destination_status", table_name="deliveries")
    op.create_index(
        "ix_deliveries_destination_status", "deliveries", ["destination", "status", "created_at"]
    )
    op.create_index("ix_deliveries_status_created", "deliveries", ["status", "created_at"])
    op.create_index("ix_delivery_attempts_started_at", "delivery_attempts", ["started_at"])


def _backfill() -> None:
    """Stored events get the two fields from their dedup key, which joins them (``id|event``)
    for every kind; a hashed key (``sha256:...``) had neither."""
    events = sa.table(
        "received_events",
        sa.column("id", sa.String),
        sa.column("dedup_key", sa.String),
        sa.column("platform_id", sa.String),
        sa.column("event_name", sa.String),
    )
    conn = op.get_bind()
    last = ""
    while True:
        rows = conn.execute(
            sa.select(events.c.id, events.c.dedup_key)
            .where(events.c.id > last)
            .order_by(events.c.id)
            .limit(BACKFILL_BATCH)
        ).all()
        if not rows:
            return
        last = rows[-1].id
        changes = [
            {"row_id": row.id, "pid": pid, "name": name}
            for row in rows
            for pid, name in [_split(row.dedup_key)]
            if pid is not None
        ]
        if changes:
            conn.execute(
                events.update()
                .where(events.c.id == sa.bindparam("row_id"))
                .values(platform_id=sa.bindparam("pid"), event_name=sa.bindparam("name")),
                changes,
            )


def _split(key: str) -> tuple[str | None, str | None]:
    if key.startswith("sha256:"):
        return None, None
    platform_id, _, name = key.partition("|")
    return platform_id[:200], (name[:64] or None)


def downgrade() -> None:
    op.drop_index("ix_delivery_attempts_started_at", table_name="delivery_attempts")
    op.drop_index("ix_deliveries_status_created", table_name="deliveries")
    op.drop_index("ix_deliveries_destination_status", table_name="deliveries")
    op.create_index("ix_deliveries_destination_status", "deliveries", ["destination", "status"])
    op.drop_index("ix_rejected_bodies_last_seen_at", table_name="rejected_bodies")
    op.drop_index("ix_received_events_platform_id", table_name="received_events")
    op.drop_index("ix_received_events_source", table_name="received_events")
    op.drop_index("ix_received_events_kind_event", table_name="received_events")
    op.create_index("ix_received_events_kind", "received_events", ["kind"])
    with op.batch_alter_table("received_events") as batch:
        batch.drop_column("event_name")
        batch.drop_column("platform_id")
