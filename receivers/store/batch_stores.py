"""How a batch of the in-process group commit reaches the database: the SQLAlchemy engine."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import bindparam, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from receivers.store.records import IDENTITY_COLUMNS, Identity, StoreUnavailable, identity
from receivers.store.rows import BatchRows
from receivers.store.tables import ReceivedEvent, RejectedBody

EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__


class BatchStore(Protocol):
    """Writes batches, each in one transaction."""

    slots: int
    """How many batches may be handed over before the first one is written (each takes its
    events only when its write starts)."""

    def write(self, build: Callable[[], BatchRows]) -> Awaitable[dict[Identity, str]]:
        """Write the batch that ``build`` gives, calling it only when the write starts (so that a
        batch waiting for its turn takes what arrived meanwhile): insert the event rows unless
        stored already, add ``duplicates + 1`` to the stored row of those that were, upsert the
        quarantine rows by body hash. Answers every identity's stored id."""
        ...

    async def close(self) -> None:
        """Release what the store holds."""
        ...


class SqlAlchemyStore:
    """One transaction per batch on the engine, with statements built once."""

    slots = 1

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    def write(self, build: Callable[[], BatchRows]) -> Awaitable[dict[Identity, str]]:
        return self._write(build)

    async def close(self) -> None:
        return None

    async def _write(self, build: Callable[[], BatchRows]) -> dict[Identity, str]:
        rows = build()
        events, rejections = rows.events, rows.rejections
        ids: dict[Identity, str] = {}
        if not events and not rejections:
            return ids
        async with self._engine.begin() as conn:
            statements = _statements(conn.dialect.name)
            if events:
                inserted = set((await conn.execute(statements.insert_events, events)).scalars())
                copies: dict[Identity, int] = {}
                for row in events:
                    if row["id"] in inserted:
                        ids[identity(row)] = row["id"]
                    else:
                        copies[identity(row)] = row["duplicates"] + 1
                if copies:
                    ids |= await _count_copies(conn, statements, copies)
            if rejections:
                await conn.execute(statements.upsert_rejected, rejections)
        return ids


@dataclass(frozen=True)
class _Statements:
    """One backend's statements, built once so that SQLAlchemy compiles each of them once."""

    insert_events: Any
    find_events: Any
    count_copies: Any
    upsert_rejected: Any


@functools.cache
def _statements(backend: str) -> _Statements:
    dml = {"postgresql": postgresql, "sqlite": sqlite}.get(backend)
    if dml is None:
        raise StoreUnavailable(f"unsupported database backend {backend!r}")
    identity_columns = [EVENTS.c[name] for name in IDENTITY_COLUMNS]
    identity = tuple_(*identity_columns)
    rejected = dml.insert(REJECTED)
    return _Statements(
        insert_events=dml.insert(EVENTS)
        .on_conflict_do_nothing(index_elements=IDENTITY_COLUMNS)
        .returning(EVENTS.c.id),
        find_events=select(EVENTS.c.id, *identity_columns).where(
            identity.in_(bindparam("identities", expanding=True))
        ),
        count_copies=update(EVENTS)
        .where(EVENTS.c.id == bindparam("event_id"))
        .values(duplicates=EVENTS.c.duplicates + bindparam("extra")),
        upsert_rejected=rejected.on_conflict_do_update(
            index_elements=["body_hash"],
            set_={
                "count": REJECTED.c.count + rejected.excluded.count,
                "last_seen_at": rejected.excluded.last_seen_at,
            },
        ),
    )


async def _count_copies(
    conn: AsyncConnection, statements: _Statements, counts: dict[Identity, int]
) -> dict[Identity, str]:
    """Add the copies to the stored rows (inserted earlier or by another process); their ids."""
    query = statements.find_events.params(identities=list(counts))
    ids = {(r[1], r[2], r[3]): r[0] for r in await conn.execute(query)}
    missing = set(counts) - set(ids)
    if missing:
        raise RuntimeError(f"{len(missing)} conflicting events vanished")
    await conn.execute(
        statements.count_copies,
        [{"event_id": ids[identity], "extra": n} for identity, n in counts.items()],
    )
    return ids
