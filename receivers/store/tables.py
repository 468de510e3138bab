"""SQLModel tables of the receiving side: received events and quarantined bodies."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Index, LargeBinary, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite stores it naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class ReceivedEvent(SQLModel, table=True):
    """One accepted callback, stored before it was answered."""

    __tablename__ = "received_events"
    __table_args__ = (
        UniqueConstraint("source", "kind", "dedup_key", name="uq_received_events_dedup"),
        # The console's lists: one index per filter, in the list's order (time, then id);
        # on SQLite also ix_received_events_listed (relay.console.queries.ListedEvents).
        Index("ix_received_events_received_at", "received_at", "id"),
        Index("ix_received_events_kind", "kind", "received_at", "id"),
        Index("ix_received_events_kind_event", "kind", "event_name", "received_at", "id"),
        Index("ix_received_events_event", "event_name", "received_at", "id"),
        Index("ix_received_events_source", "source", "received_at", "id"),
        Index("ix_received_events_platform_id", "platform_id", "received_at", "id"),
    )

    id: str = Field(primary_key=True, max_length=36)
    source: str = Field(max_length=64)
    kind: str = Field(max_length=64)
    dedup_key: str = Field(max_length=300)
    received_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    payload: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    raw_body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    content_type: str | None = Field(default=None, max_length=255)
    method: str = Field(max_length=8)
    remote_addr: str | None = Field(default=None, max_length=64)
    duplicates: int = Field(default=0)
    platform_id: str | None = Field(default=None, max_length=200)
    """The platform's id of what the event is about (requestId, msgid, messageId, callId)."""
    event_name: str | None = Field(default=None, max_length=64)
    """Its status or event name, lower-cased (``delivered``, ``messagestatus::seen``)."""


class RejectedBody(SQLModel, table=True):
    """A body that could not be decoded or did not fit its kind's model (quarantine)."""

    __tablename__ = "rejected_bodies"
    __table_args__ = (
        UniqueConstraint("body_hash", name="uq_rejected_bodies_body_hash"),
        Index("ix_rejected_bodies_last_seen_at", "last_seen_at", "id"),
    )

    id: str = Field(primary_key=True, max_length=36)
    source: str = Field(max_length=64)
    path: str = Field(max_length=255)
    kind: str | None = Field(default=None, max_length=64)
    status: int
    reason: str = Field(max_length=1000)
    errors: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False)
    )
    body_hash: str = Field(max_length=71)
    raw_body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    content_type: str | None = Field(default=None, max_length=255)
    remote_addr: str | None = Field(default=None, max_length=64)
    received_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    last_seen_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    count: int = Field(default=1)
