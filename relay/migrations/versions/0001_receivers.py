"""Received events, quarantined bodies and instance settings.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from receivers.store import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "received_events",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("dedup_key", sa.String(300), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("raw_body", sa.LargeBinary(), nullable=False),
        sa.Column("content_type", sa.String(255), nullable=True),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("remote_addr", sa.String(64), nullable=True),
        sa.Column("duplicates", sa.Integer(), nullable=False, server_default="0"),
        sa.UniqueConstraint("source", "kind", "dedup_key", name="uq_received_events_dedup"),
    )
    op.create_index("ix_received_events_received_at", "received_events", ["received_at"])
    op.create_index("ix_received_events_kind", "received_events", ["kind"])
    op.create_table(
        "rejected_bodies",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("path", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(64), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(1000), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.Column("body_hash", sa.String(71), nullable=False),
        sa.Column("raw_body", sa.LargeBinary(), nullable=False),
        sa.Column("content_type", sa.String(255), nullable=True),
        sa.Column("remote_addr", sa.String(64), nullable=True),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", UTCDateTime(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False, server_default="1"),
        sa.UniqueConstraint("body_hash", name="uq_rejected_bodies_body_hash"),
    )
    op.create_table(
        "relay_instance_settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(1000), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("relay_instance_settings")
    op.drop_table("rejected_bodies")
    op.drop_index("ix_received_events_kind", table_name="received_events")
    op.drop_index("ix_received_events_received_at", table_name="received_events")
    op.drop_table("received_events")
