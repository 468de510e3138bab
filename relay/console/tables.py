"""SQLModel tables of the console: its sessions and its login throttle, shared by every replica."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Column, Index
from sqlmodel import Field, SQLModel

from receivers.store import UTCDateTime


class ConsoleSession(SQLModel, table=True):
    """One login. The cookie carries a random token; only its SHA-256 is kept here, so a copy
    of the table lets no one in."""

    __tablename__ = "console_sessions"
    __table_args__ = (
        Index("ix_console_sessions_user", "user_name", "ended_at"),
        Index("ix_console_sessions_expires_at", "expires_at"),
    )

    id: str = Field(primary_key=True, max_length=64)
    """The SHA-256 (hex) of the cookie's token."""
    user_name: str = Field(max_length=64)
    password_fingerprint: str = Field(max_length=64)
    """A keyed MAC of the password the session was opened with: a new password ends it."""
    created_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    last_seen_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    expires_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    ended_at: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    end_reason: str | None = Field(default=None, max_length=32)


class LoginThrottleEntry(SQLModel, table=True):
    """Failed logins counted against one key: a client address, a user name (tried from
    browsers without that user's device cookie) or one device cookie."""

    __tablename__ = "console_login_throttle"
    __table_args__ = (Index("ix_console_login_throttle_updated_at", "updated_at"),)

    key: str = Field(primary_key=True, max_length=100)
    failures: int = 0
    """Attempts counted as failed (an attempt counts from its start until it succeeds)."""
    blocked_until: datetime | None = Field(default=None, sa_column=Column(UTCDateTime()))
    updated_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False))
    """The last attempt counted: the key is forgotten a day after it."""
