"""What a stored event costs on disk, and what a prune gives back, on SQLite and PostgreSQL.

For each body size (``--sizes``, default 1 KiB, 16 KiB, 256 KiB and 1 MiB) and backend, on a
fresh store (a SQLite file in a temporary directory; a PostgreSQL database ``cost_<random>``
created through ``--pg-admin-dsn``, dropped at the end), both migrated:

1. N ``sms.inbound`` callbacks of that size (an unknown field of random base64 makes up the
   size; N = ``--bytes`` / size, between 20 and 2,000) are POSTed through the receivers' app
   in-process (authentication, the kind's model, the store's write path), then routed to one
   destination (``relay.outbox.route_events``) and marked succeeded with one attempt row: an
   event as it is kept once delivered;
2. the store's size is read: SQLite's used pages (``page_count - freelist_count``, after a WAL
   checkpoint) and its file; PostgreSQL's ``pg_total_relation_size`` of every table (heap,
   TOAST and indexes). The cost of one event is the growth over the empty store, divided by N;
3. everything is pruned (``relay.store.retention.prune``); the sizes are read again (SQLite's file,
   PostgreSQL's tables before and after a plain ``VACUUM``), then N more events are stored the
   same way, to show whether the freed space is used again.

Run it with the project's interpreter (PostgreSQL on 127.0.0.1)::

    python scripts/store_cost.py [--backends sqlite,postgresql] [--sizes 1024,16384,...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import harness
import httpx
from benchlib import BenchError, fresh_store, require_local
from sqlalchemy import insert, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import ReceiverConfig, SourceConfig, create_app
from relay import outbox
from relay.destinations import parse_destination_config
from relay.outbox.router import Router
from relay.outbox.tables import SUCCEEDED
from relay.simulator import factories
from relay.store import retention

DEFAULT_PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_SIZES = (1024, 16 * 1024, 256 * 1024, 1024 * 1024)
TOKEN = "store-cost-token-0123456789"
TABLES = ("received_events", "routed_events", "deliveries", "delivery_attempts")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
MIB = 1024 * 1024


@dataclass
class Figures:
    """One backend and body size."""

    backend: str
    body_bytes: int
    events: int
    stored_bytes_per_event: float
    ratio_to_body: float
    file_bytes_full: int
    file_bytes_after_prune: int
    file_bytes_after_vacuum: int | None
    file_bytes_after_refill: int


def body_of(size: int, rng: random.Random) -> bytes:
    """An ``sms.inbound`` body of ``size`` bytes (within a few), padded by an unknown field."""
    payload = factories.sms_inbound(rng=rng)
    base = len(json.dumps({**payload, "attachment": ""}).encode())
    filler = base64.b64encode(rng.randbytes(max(size - base, 0) * 3 // 4 + 3)).decode()
    payload["attachment"] = filler[: max(size - base, 0)]
    return json.dumps(payload).encode()


async def store(engine: AsyncEngine, bodies: list[bytes]) -> None:
    """POST ``bodies`` through the receivers, route them to one destination, and mark each
    delivery succeeded after one attempt."""
    config = ReceiverConfig(
        sources={"default": SourceConfig(token=TOKEN)},
        max_body_bytes=2 * max(len(b) for b in bodies),
        writer_process=False,
    )
    app = create_app(config, engine)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://relay.cost") as client,
    ):
        for body in bodies:
            answer = await client.post(
                f"/hooks/sms/inbound?token={TOKEN}",
                content=body,
                headers={"content-type": "application/json"},
            )
            if answer.status_code != 200:
                raise BenchError(f"a callback was answered {answer.status_code}: {answer.text}")
    router = Router({"crm": parse_destination_config({"type": "http", "url": "http://x/"})})
    while events := await outbox.unrouted_events(engine, NOW + timedelta(days=3650), 500):
        due = await outbox.route_events(engine, router, events, NOW)
        async with engine.begin() as conn:
            await conn.execute(
                update(outbox.DELIVERIES)
                .where(outbox.DELIVERIES.c.id.in_([d.id for d in due]))
                .values(status=SUCCEEDED, attempts=1, finished_at=NOW, next_attempt_at=None)
            )
            await conn.execute(
                insert(outbox.ATTEMPTS),
                [
                    {
                        "delivery_id": d.id,
                        "number": 1,
                        "started_at": NOW,
                        "duration_ms": 12.5,
                        "status_code": 200,
                        "response_excerpt": "ok",
                    }
                    for d in due
                ],
            )


async def used_bytes(engine: AsyncEngine) -> tuple[int, int]:
    """(bytes the store's rows take, bytes of its files on disk)."""
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = (await conn.exec_driver_sql("PRAGMA page_count")).scalar_one()
            free = (await conn.exec_driver_sql("PRAGMA freelist_count")).scalar_one()
            size = (await conn.exec_driver_sql("PRAGMA page_size")).scalar_one()
            database = engine.url.database or ""
            on_disk = sum(
                os.path.getsize(database + suffix)
                for suffix in ("", "-wal")
                if os.path.exists(database + suffix)
            )
            return (pages - free) * size, on_disk
        names = ", ".join(f"'{name}'" for name in TABLES)
        total = (
            await conn.execute(
                text(f"SELECT sum(pg_total_relation_size(c)) FROM unnest(ARRAY[{names}]) c")
            )
        ).scalar_one()
        return int(total), int(total)


async def vacuum(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        for name in TABLES:
            await conn.exec_driver_sql(f"VACUUM {name}")


async def measure(backend: str, size: int, budget: int, admin_dsn: str) -> Figures:
    rng = random.Random(size)
    count = max(20, min(2000, budget // size))
    async with fresh_store(backend, admin_dsn, "cost") as engine:
        empty, _ = await used_bytes(engine)
        await store(engine, [body_of(size, rng) for _ in range(count)])
        full, full_file = await used_bytes(engine)
        pruned = await retention.prune(engine, datetime.now(UTC) + timedelta(days=1))
        if pruned.events != count:
            raise BenchError(f"the prune removed {pruned.events} of {count} events")
        _, pruned_file = await used_bytes(engine)
        vacuumed = None
        if backend == "postgresql":
            await vacuum(engine)
            _, vacuumed = await used_bytes(engine)
        await store(engine, [body_of(size, rng) for _ in range(count)])
        _, refilled_file = await used_bytes(engine)
    per_event = (full - empty) / count
    return Figures(
        backend,
        size,
        count,
        round(per_event),
        round(per_event / size, 2),
        full_file,
        pruned_file,
        vacuumed,
        refilled_file,
    )


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--bytes", type=int, default=32 * MIB, help="bodies stored per size")
    parser.add_argument(
        "--pg-admin-dsn", default=os.environ.get("RELAY_TEST_PG_DSN", DEFAULT_PG_ADMIN_DSN)
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    async def rows() -> list[Figures]:
        return [
            await measure(backend, int(size), args.bytes, args.pg_admin_dsn)
            for backend in args.backends.split(",")
            for size in args.sizes.split(",")
        ]

    def run() -> harness.Rows:
        require_local(args.pg_admin_dsn, "PostgreSQL")
        return harness.Rows(asyncio.run(rows()), as_text)

    return harness.run_main("store_cost", run, args.json)


def as_text(rows: list[Figures]) -> str:
    lines = [
        "backend     body      events  per event   x body  full MiB  pruned MiB  "
        "vacuumed MiB  refilled MiB"
    ]
    for r in rows:
        lines.append(
            f"{r.backend:<10}  {r.body_bytes:>8}  {r.events:>6}  {r.stored_bytes_per_event:>9}  "
            f"{r.ratio_to_body:>6}  {mib(r.file_bytes_full):>8}  "
            f"{mib(r.file_bytes_after_prune):>10}  {mib(r.file_bytes_after_vacuum):>12}  "
            f"{mib(r.file_bytes_after_refill):>12}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
