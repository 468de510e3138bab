"""Per-key ordering: each delivery's order key and its event's arrival time, and the index that
finds the deliveries ahead of one in its key's line.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from receivers.store import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("order_key", sa.String(200), nullable=True))
        batch.add_column(sa.Column("arrived_at", UTCDateTime(), nullable=True))
    op.create_index(
        "ix_deliveries_order", "deliveries", ["destination", "order_key", "status", "arrived_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_deliveries_order", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("arrived_at")
        batch.drop_column("order_key")
