"""The relay's outbox: routed events, deliveries, attempts, destination state.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from receivers.store import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "routed_events",
        sa.Column("event_id", sa.String(36), sa.ForeignKey("received_events.id"), primary_key=True),
        sa.Column("routed_at", UTCDateTime(), nullable=False),
        sa.Column("deliveries", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("event_id", sa.String(36), sa.ForeignKey("received_events.id"), nullable=False),
        sa.Column("destination", sa.String(64), nullable=False),
        sa.Column("policy", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("schedule_base", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("first_attempt_at", UTCDateTime(), nullable=True),
        sa.Column("last_attempt_at", UTCDateTime(), nullable=True),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("leased_until", UTCDateTime(), nullable=True),
        sa.Column("lease_token", sa.String(36), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(1000), nullable=True),
        sa.UniqueConstraint("event_id", "destination", name="uq_deliveries_event_destination"),
    )
    op.create_index("ix_deliveries_due", "deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_deliveries_destination_status", "deliveries", ["destination", "status"])
    op.create_table(
        "delivery_attempts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.String(36), sa.ForeignKey("deliveries.id"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
        sa.Column("response_excerpt", sa.String(1024), nullable=True),
        sa.UniqueConstraint("delivery_id", "number", name="uq_delivery_attempts_number"),
    )
    op.create_table(
        "destination_states",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("paused_until", UTCDateTime(), nullable=True),
        sa.Column("disabled", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("disabled_reason", sa.String(1000), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("destination_states")
    op.drop_table("delivery_attempts")
    op.drop_index("ix_deliveries_destination_status", table_name="deliveries")
    op.drop_index("ix_deliveries_due", table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_table("routed_events")
