"""Prune benchmark: does a batch of the retention stay as fast in a store of 1,000,000 events
as in one of 10,000?

For each backend (``--backends``: a SQLite file in a temporary directory; a PostgreSQL database
``prune_<random>`` created through ``--pg-admin-dsn``, dropped at the end), one store grows in
steps (``--sizes``, default 10,000 then 1,000,000 events). Each event (a 300-byte body) was
received over 60 days, routed to one destination, and its delivery succeeded after one attempt
(written in bulk with the store's ``insert_rows_async``; PostgreSQL is then ``VACUUM ANALYZE``d,
as autovacuum would). At each size, with the cutoff halfway through those 60 days:

1. batch: ``relay.store.retention.prune`` is run for ``--batches`` batches (``BATCH_EVENTS`` events
   each) and stopped; a batch's time is from the end of one removal to the end of the next (the
   query that finds the next page, then its transaction): the median is reported;
2. count: ``relay.store.retention.count_prunable`` (what ``relay store prune --dry-run`` runs),
   once;
3. skip: the deliveries of the oldest 10 % of the events are made pending (they must stay), and
   the time until the first batch is removed is measured: the one page query of a pass that
   passes over them. They are made succeeded again afterwards.

The report: per backend and size the three times, and the ratio of the largest size's batch to
the smallest's (the baseline of the same run): near 1 means a batch does not grow with the
store. ``--json`` prints one object per row.

Run it with the project's interpreter (PostgreSQL on 127.0.0.1)::

    python scripts/bench_prune.py [--backends sqlite,postgresql] [--sizes 10000,1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import harness
from benchlib import BenchError, fresh_store, require_local
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import new_ids
from receivers.store import insert_rows_async
from relay import outbox
from relay.outbox.tables import PENDING, SUCCEEDED
from relay.store import retention

DEFAULT_PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
START = datetime(2026, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=60)
CUTOFF = START + SPAN / 2
CHUNK = 10_000
BODY = b'{"requestId": "%d", "message": "' + b"x" * 260 + b'"}'


class Stop(Exception):
    """Ends a pass after the batches the benchmark wanted."""


@dataclass
class Figures:
    backend: str
    events: int
    batch_ms: float
    count_s: float
    skip_kept_ms: float
    ratio_to_smallest: float = 1.0


async def fill(engine: AsyncEngine, start: int, stop: int, total: int) -> None:
    """Events ``start`` to ``stop`` of ``total`` (spread evenly over :data:`SPAN`), each with
    its routed mark and a delivery that succeeded after one attempt."""
    for first in range(start, stop, CHUNK):
        numbers = range(first, min(first + CHUNK, stop))
        times = [START + SPAN * n / total for n in numbers]
        event_ids = [new_ids(at, 1)[0] for at in times]
        delivery_ids = [new_ids(at, 1)[0] for at in times]
        events, routed, deliveries, attempts = [], [], [], []
        for n, at, event_id, delivery_id in zip(
            numbers, times, event_ids, delivery_ids, strict=True
        ):
            body = BODY % n
            events.append(
                {
                    "id": event_id,
                    "source": "default",
                    "kind": "sms.inbound",
                    "dedup_key": str(n),
                    "received_at": at,
                    "payload": {"requestId": str(n), "message": "x" * 260},
                    "raw_body": body,
                    "content_type": "application/json",
                    "method": "POST",
                    "remote_addr": "127.0.0.1",
                    "duplicates": 0,
                    "platform_id": str(n),
                    "event_name": None,
                }
            )
            routed.append({"event_id": event_id, "routed_at": at, "deliveries": 1})
            deliveries.append(
                {
                    "id": delivery_id,
                    "event_id": event_id,
                    "destination": "crm",
                    "policy": "platform-sms",
                    "status": SUCCEEDED,
                    "attempts": 1,
                    "schedule_base": 0,
                    "created_at": at,
                    "first_attempt_at": at,
                    "last_attempt_at": at,
                    "next_attempt_at": None,
                    "finished_at": at,
                    "arrived_at": at,
                }
            )
            attempts.append(
                {
                    "delivery_id": delivery_id,
                    "number": 1,
                    "started_at": at,
                    "duration_ms": 10.0,
                    "status_code": 200,
                }
            )
        async with engine.begin() as conn:
            await insert_rows_async(conn, outbox.EVENTS, events, ["id"])
            await insert_rows_async(conn, outbox.ROUTED, routed, ["event_id"])
            await insert_rows_async(conn, outbox.DELIVERIES, deliveries, ["id"])
            await insert_rows_async(conn, outbox.ATTEMPTS, attempts, ["delivery_id", "number"])
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE")


async def batch_times(engine: AsyncEngine, batches: int) -> list[float]:
    """Seconds of each of the first ``batches`` batches of a pass (the first from the pass's
    start, the others from the previous batch's end)."""
    ends: list[float] = [time.perf_counter()]

    async def pause(_: float) -> None:
        ends.append(time.perf_counter())
        if len(ends) > batches:
            raise Stop

    with contextlib.suppress(Stop):
        await retention.prune(engine, CUTOFF, pause=pause)
    if len(ends) <= batches:
        raise BenchError(f"the pass ended after {len(ends) - 1} of {batches} batches")
    return [b - a for a, b in itertools.pairwise(ends)]


async def set_oldest(engine: AsyncEngine, count: int, status: str) -> None:
    oldest = select(outbox.EVENTS.c.id).order_by(outbox.EVENTS.c.received_at).limit(count)
    async with engine.begin() as conn:
        await conn.execute(
            update(outbox.DELIVERIES)
            .where(outbox.DELIVERIES.c.event_id.in_(oldest.scalar_subquery()))
            .values(status=status, finished_at=None if status == PENDING else START)
        )


async def measure(engine: AsyncEngine, backend: str, size: int, batches: int) -> Figures:
    times = await batch_times(engine, batches)
    started = time.perf_counter()
    await retention.count_prunable(engine, CUTOFF)
    counted = time.perf_counter() - started
    async with engine.connect() as conn:
        stored = (await conn.execute(select(outbox.EVENTS.c.id).limit(1))).all()
    if not stored:
        raise BenchError("the store is empty")
    await set_oldest(engine, size // 10, PENDING)
    [skip] = await batch_times(engine, 1)
    await set_oldest(engine, size // 10, SUCCEEDED)
    return Figures(backend, size, statistics.median(times[1:]) * 1000, counted, skip * 1000)


async def run(backend: str, sizes: list[int], batches: int, admin_dsn: str) -> list[Figures]:
    rows: list[Figures] = []
    async with fresh_store(backend, admin_dsn, "prune") as engine:
        stored = 0
        for size in sizes:
            started = time.perf_counter()
            await fill(engine, stored, size, sizes[-1])
            print(
                f"{backend}: {size} events stored in {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )
            stored = size
            rows.append(await measure(engine, backend, size, batches))
    for row in rows:
        row.ratio_to_smallest = round(row.batch_ms / rows[0].batch_ms, 2)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument(
        "--pg-admin-dsn", default=os.environ.get("RELAY_TEST_PG_DSN", DEFAULT_PG_ADMIN_DSN)
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))
    if sizes[0] < 10 * args.batches * retention.BATCH_EVENTS:
        parser.error(f"each size needs at least {10 * args.batches * retention.BATCH_EVENTS}")

    async def rows() -> list[Figures]:
        return [
            row
            for backend in args.backends.split(",")
            for row in await run(backend, sizes, args.batches, args.pg_admin_dsn)
        ]

    def report() -> harness.Rows:
        require_local(args.pg_admin_dsn, "PostgreSQL")
        return harness.Rows(asyncio.run(rows()), as_text)

    return harness.run_main("bench_prune", report, args.json)


def as_text(rows: list[Figures]) -> str:
    lines = ["backend       events  batch ms  count s  skip 10% kept ms  batch / smallest's"]
    for r in rows:
        lines.append(
            f"{r.backend:<10}  {r.events:>8}  {r.batch_ms:>8.1f}  {r.count_s:>7.2f}  "
            f"{r.skip_kept_ms:>16.1f}  {r.ratio_to_smallest:>18}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
