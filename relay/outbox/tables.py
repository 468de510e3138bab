"""SQLModel tables of the relay side: the outbox (deliveries, attempts, destination state)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, ForeignKey, Index, String, UniqueConstraint
from sqlmodel import Field, SQLModel

from receivers.store import UTCDateTime

PENDING = "pending"
SUCCEEDED = "succeeded"
DEAD = "dead"
HELD = "held"  # waiting for an operator: the destination is disabled (410) or gone from config
DELIVERY_STATUSES = (PENDING, SUCCEEDED, DEAD, HELD)


class InstanceSetting(SQLModel, table=True):
    """A value this installation generated for itself and keeps across restarts."""

    __tablename__ = "relay_instance_settings"

    key: str = Field(primary_key=True, max_length=64)
    value: str = Field(max_length=1000)


class RoutedEvent(SQLModel, table=True):
    """Marks a received event whose deliveries have been created (the router ran)."""

    __tablename__ = "routed_events"

    event_id: str = Field(
        sa_column=Column(String(36), ForeignKey("received_events.id"), primary_key=True)
    )
    routed_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    deliveries: int = 0


class Delivery(SQLModel, table=True):
    """One event on its way to one destination; its whole state lives here."""

    __tablename__ = "deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "destination", name="uq_deliveries_event_destination"),
        Index("ix_deliveries_due", "status", "next_attempt_at"),
        # The console's lists: one index per filter, in the list's order (time, then id).
        Index("ix_deliveries_created", "created_at", "id"),
        Index("ix_deliveries_status_created", "status", "created_at", "id"),
        Index("ix_deliveries_destination_created", "destination", "created_at", "id"),
        Index("ix_deliveries_destination_status", "destination", "status", "created_at", "id"),
        Index("ix_deliveries_order", "destination", "order_key", "status", "arrived_at"),
    )

    id: str = Field(primary_key=True, max_length=36)
    event_id: str = Field(
        sa_column=Column(String(36), ForeignKey("received_events.id"), nullable=False)
    )
    destination: str = Field(max_length=64)
    policy: str = Field(max_length=64)
    status: str = Field(default=PENDING, max_length=16)
    attempts: int = 0
    schedule_base: int = 0  # attempts made before the last replay (the schedule restarts there)
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    first_attempt_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    last_attempt_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    next_attempt_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    finished_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    leased_until: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    lease_token: str | None = Field(default=None, max_length=36)
    last_status_code: int | None = None
    last_error: str | None = Field(default=None, max_length=1000)
    job_id: str | None = Field(default=None, max_length=64)  # the batch job of its first attempt
    order_key: str | None = Field(default=None, max_length=200)
    """Per-key ordering: deliveries of one key and destination go one at a time
    (relay.outbox.ordering)."""
    arrived_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    """When its event arrived (the event's received_at): its place in its order key's line."""


class DeliveryAttempt(SQLModel, table=True):
    """One try of a delivery (only the first 3 and the last 20 are kept per delivery)."""

    __tablename__ = "delivery_attempts"
    __table_args__ = (
        UniqueConstraint("delivery_id", "number", name="uq_delivery_attempts_number"),
        Index("ix_delivery_attempts_started_at", "started_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: str = Field(
        sa_column=Column(String(36), ForeignKey("deliveries.id"), nullable=False)
    )
    number: int
    started_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    duration_ms: float
    status_code: int | None = None
    error: str | None = Field(default=None, max_length=1000)
    response_excerpt: str | None = Field(default=None, max_length=1024)


class DestinationState(SQLModel, table=True):
    """A destination's health, shared by every worker: the breaker and the 410 switch."""

    __tablename__ = "destination_states"

    name: str = Field(primary_key=True, max_length=64)
    consecutive_failures: int = 0
    paused_until: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    disabled: bool = False
    disabled_reason: str | None = Field(default=None, max_length=1000)
    updated_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
