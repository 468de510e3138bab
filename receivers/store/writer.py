"""Group commit: concurrent requests share one transaction, so durable commits stay cheap.

Requests hand their event to :class:`EventWriter` and wait. A single task takes everything that
queued up while the previous commit was running, writes it with one multi-row Core insert, commits
once, then wakes every waiter. A duplicate (same source, kind and dedup key) is never inserted
twice, also when copies arrive in the same batch or in another process: the unique constraint
decides and the loser is counted on the stored row.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from receivers.ids import new_id
from receivers.store.tables import ReceivedEvent, RejectedBody

log = logging.getLogger(__name__)

EVENTS = ReceivedEvent.__table__
REJECTED = RejectedBody.__table__
MAX_BATCH = 256

Clock = Callable[[], datetime]


class StoreUnavailable(Exception):
    """The database could not take the write; the caller should answer 503."""


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

    @property
    def identity(self) -> tuple[str, str, str]:
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


@dataclass(frozen=True)
class Receipt:
    """The stored event's id; ``duplicate`` when it had been stored before."""

    event_id: str
    duplicate: bool


@dataclass(frozen=True)
class StoredEvent:
    """What the after-commit hook gets for each newly stored event."""

    id: str
    source: str
    kind: str
    received_at: datetime
    payload: dict[str, Any]


AfterCommit = Callable[[Sequence[StoredEvent]], Awaitable[None]]


@dataclass
class _Pending:
    item: Arrival | Rejection
    future: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def body_hash(raw_body: bytes) -> str:
    """The fallback identity of a body."""
    return "sha256:" + hashlib.sha256(raw_body).hexdigest()


class EventWriter:
    """The single writer task of one process; see the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        clock: Clock,
        after_commit: AfterCommit | None = None,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._after_commit = after_commit
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the writer task."""
        self._task = asyncio.create_task(self._run(), name="event-writer")

    async def stop(self) -> None:
        """Write what is queued, then stop."""
        if self._task is None:
            return
        await self._queue.put(None)
        await self._task
        self._task = None

    async def store(self, arrival: Arrival) -> Receipt:
        """Store an event (or count a duplicate); returns once it is committed."""
        result: Receipt = await self._submit(arrival)
        return result

    async def quarantine(self, rejection: Rejection) -> None:
        """Keep a rejected body (deduplicated by body hash); returns once committed."""
        await self._submit(rejection)

    async def _submit(self, item: Arrival | Rejection) -> Any:
        if self._task is None or self._task.done():
            raise StoreUnavailable("the event writer is not running")
        pending = _Pending(item)
        await self._queue.put(pending)
        return await pending.future

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            first = await self._queue.get()
            batch: list[_Pending] = []
            if first is None:
                stopping = True
            else:
                batch.append(first)
            while len(batch) < self._max_batch and not self._queue.empty():
                pending = self._queue.get_nowait()
                if pending is None:
                    stopping = True
                else:
                    batch.append(pending)
            if batch:
                await self._write(batch)

    async def _write(self, batch: list[_Pending]) -> None:
        try:
            stored = await self._write_batch(batch)
        except Exception as exc:
            if len(batch) > 1 and not _is_connection_error(exc):
                log.warning(
                    "batch write failed (%s); writing its items one by one", type(exc).__name__
                )
                for pending in batch:
                    await self._write([pending])
                return
            log.error("store unavailable: %s", type(exc).__name__, exc_info=exc)
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(StoreUnavailable(str(type(exc).__name__)))
            return
        if stored and self._after_commit is not None:
            try:
                await self._after_commit(stored)
            except Exception:
                log.exception("after-commit hook failed; the events are stored and will be swept")

    async def _write_batch(self, batch: list[_Pending]) -> list[StoredEvent]:
        now = self._clock()
        arrivals = [p for p in batch if isinstance(p.item, Arrival)]
        rejections = [p for p in batch if isinstance(p.item, Rejection)]
        async with self._engine.begin() as conn:
            receipts, stored = await self._insert_events(conn, arrivals, now)
            await self._insert_rejections(conn, rejections, now)
        for pending in arrivals:
            if not pending.future.done():
                pending.future.set_result(receipts[id(pending)])
        for pending in rejections:
            if not pending.future.done():
                pending.future.set_result(None)
        return stored

    async def _insert_events(
        self, conn: AsyncConnection, arrivals: list[_Pending], now: datetime
    ) -> tuple[dict[int, Receipt], list[StoredEvent]]:
        receipts: dict[int, Receipt] = {}
        if not arrivals:
            return receipts, []
        groups: dict[tuple[str, str, str], list[_Pending]] = {}
        for pending in arrivals:
            assert isinstance(pending.item, Arrival)
            groups.setdefault(pending.item.identity, []).append(pending)
        rows = []
        for identity, copies in groups.items():
            first = copies[0].item
            assert isinstance(first, Arrival)
            rows.append(
                {
                    "id": new_id(now),
                    "source": identity[0],
                    "kind": identity[1],
                    "dedup_key": identity[2],
                    "received_at": now,
                    "payload": first.payload,
                    "raw_body": first.raw_body,
                    "content_type": first.content_type,
                    "method": first.method,
                    "remote_addr": first.remote_addr,
                    "duplicates": len(copies) - 1,
                }
            )
        insert = _dialect_insert(conn, EVENTS).values(rows)
        insert = insert.on_conflict_do_nothing(index_elements=["source", "kind", "dedup_key"])
        inserted = set((await conn.execute(insert.returning(EVENTS.c.id))).scalars())

        stored: list[StoredEvent] = []
        existing: dict[tuple[str, str, str], int] = {}
        for row, copies in zip(rows, groups.values(), strict=True):
            identity = (row["source"], row["kind"], row["dedup_key"])
            if row["id"] in inserted:
                stored.append(
                    StoredEvent(row["id"], row["source"], row["kind"], now, row["payload"])
                )
                receipts[id(copies[0])] = Receipt(row["id"], duplicate=False)
                for copy in copies[1:]:
                    receipts[id(copy)] = Receipt(row["id"], duplicate=True)
            else:
                existing[identity] = len(copies)
        if existing:
            ids = await self._count_duplicates(conn, existing)
            for identity in existing:
                for copy in groups[identity]:
                    receipts[id(copy)] = Receipt(ids[identity], duplicate=True)
        return receipts, stored

    async def _count_duplicates(
        self, conn: AsyncConnection, counts: dict[tuple[str, str, str], int]
    ) -> dict[tuple[str, str, str], str]:
        matches = or_(
            *(
                and_(EVENTS.c.source == s, EVENTS.c.kind == k, EVENTS.c.dedup_key == d)
                for s, k, d in counts
            )
        )
        query = select(EVENTS.c.id, EVENTS.c.source, EVENTS.c.kind, EVENTS.c.dedup_key).where(
            matches
        )
        ids = {(r.source, r.kind, r.dedup_key): r.id for r in await conn.execute(query)}
        missing = set(counts) - set(ids)
        if missing:
            raise RuntimeError(f"{len(missing)} conflicting events vanished")
        bump = (
            update(EVENTS)
            .where(EVENTS.c.id == bindparam("event_id"))
            .values(duplicates=EVENTS.c.duplicates + bindparam("extra"))
        )
        await conn.execute(
            bump, [{"event_id": ids[identity], "extra": n} for identity, n in counts.items()]
        )
        return ids

    async def _insert_rejections(
        self, conn: AsyncConnection, rejections: list[_Pending], now: datetime
    ) -> None:
        if not rejections:
            return
        by_hash: dict[str, tuple[Rejection, int]] = {}
        for pending in rejections:
            item = pending.item
            assert isinstance(item, Rejection)
            digest = body_hash(item.raw_body)
            seen = by_hash.get(digest)
            by_hash[digest] = (seen[0], seen[1] + 1) if seen else (item, 1)
        for digest, (item, count) in by_hash.items():
            insert = _dialect_insert(conn, REJECTED).values(
                id=new_id(now),
                source=item.source,
                path=item.path[:255],
                kind=item.kind,
                status=item.status,
                reason=item.reason[:1000],
                errors=item.errors,
                body_hash=digest,
                raw_body=item.raw_body,
                content_type=item.content_type,
                remote_addr=item.remote_addr,
                received_at=now,
                last_seen_at=now,
                count=count,
            )
            upsert = insert.on_conflict_do_update(
                index_elements=["body_hash"],
                set_={"count": REJECTED.c.count + count, "last_seen_at": now},
            )
            await conn.execute(upsert)


def _dialect_insert(conn: AsyncConnection, table: Any) -> Any:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    raise StoreUnavailable(f"unsupported database backend {conn.dialect.name!r}")


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(
        exc, OperationalError | InterfaceError | OSError | ConnectionError | TimeoutError
    ):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated
