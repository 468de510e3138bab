"""What the receivers hand to the store, and what they get back."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

IDENTITY_COLUMNS = ("source", "kind", "dedup_key")

Identity = tuple[str, str, str]
Row = dict[str, Any]


class StoreUnavailable(Exception):
    """The database could not take the write; the caller should answer 503."""


class StoreFull(StoreUnavailable):
    """The store refuses writes for want of room: SQLite's "database or disk is full", a
    PostgreSQL error of class 53 (insufficient resources: ``disk_full``, ...), ENOSPC."""


class StoreUnreachable(StoreUnavailable):
    """The database cannot be reached or used right now (refused connection, time-out, lock,
    I/O error), as opposed to a row at fault."""


@dataclass(frozen=True)
class Arrival:
    """An accepted callback, ready to be stored."""

    source: str
    kind: str
    dedup_key: str
    payload: dict[str, Any]
    raw_body: bytes
    content_type: str | None
    method: str
    remote_addr: str | None
    platform_id: str | None = None
    event_name: str | None = None

    @property
    def identity(self) -> Identity:
        return (self.source, self.kind, self.dedup_key)


@dataclass(frozen=True)
class Rejection:
    """A quarantined body: undecodable (400) or not fitting its kind's model (422)."""

    source: str
    path: str
    kind: str | None
    status: int
    reason: str
    errors: list[dict[str, Any]]
    raw_body: bytes
    content_type: str | None
    remote_addr: str | None


Item = Arrival | Rejection
"""What the receivers hand to the store's writer."""


@dataclass(frozen=True)
class Receipt:
    """The stored event's id; ``duplicate`` when it had been stored before; what the in-commit
    writer answered for a new event (:mod:`receivers.store.in_commit`), None without one."""

    event_id: str
    duplicate: bool
    written_with: Any = None


@dataclass(frozen=True)
class StoredEvent:
    """What the after-commit hook gets for each newly stored event."""

    id: str
    source: str
    kind: str
    received_at: datetime
    payload: dict[str, Any]
    written_with: Any = None
    """What the in-commit writer wrote with it (:mod:`receivers.store.in_commit`); None when
    nothing was."""


AfterCommit = Callable[[Sequence[StoredEvent]], Awaitable[None]]
OnStored = Callable[[list[StoredEvent]], None]
"""How a lane of the event writer reports the newly stored events of a batch."""
Clock = Callable[[], datetime]
"""The writer's clock: the time of arrival it gives events (UTC, timezone-aware)."""


def utc_now() -> datetime:
    """The default clock."""
    return datetime.now(UTC)


def body_hash(raw_body: bytes) -> str:
    """The fallback identity of a body."""
    return "sha256:" + hashlib.sha256(raw_body).hexdigest()


def identity(row: Mapping[str, Any]) -> Identity:
    """The (source, kind, dedup key) of an event row."""
    return (row["source"], row["kind"], row["dedup_key"])
