"""How fast the console answers over a big store: 1,000,000 events and 1,000,000 deliveries,
on SQLite or PostgreSQL.

Fills a store once and keeps it for later runs (SQLite: the ``--database`` file; PostgreSQL: a
database of its own, ``--pg-database``, created on the server of ``--pg-admin-dsn`` and reused;
no other database is touched). Deliveries are mostly succeeded, some dead, pending and held,
over four destinations (one of them ordered per key), with attempts for some. Each run brings
the store's schema to this code's head first (timed: new indexes are built then), starts
`relay serve` on it, logs in to the console and times every list page and filter over HTTP:
events (newest, by kind, source, platform id, event name, a time range, combined), deliveries
(unfiltered, by status, destination, since, a time range, combined), pages 100 pages deep (the
walk there is timed too), the quarantine, the destinations page and the bulk replay's count.
The baseline is `GET /healthz` of the same server, timed the same way in the same run; each line
prints the median and p95 in ms and the ratio of the median to the baseline's. A page that takes
seconds (a list without its index sorts the whole table) is timed fewer times, at least 3, once
it took a minute, and a walk down stops after 5 minutes (the line says how many pages it walked).

    python scripts/bench_console.py --database /var/tmp/console.db          # SQLite, 1M/1M
    python scripts/bench_console.py --backend postgresql                     # PostgreSQL, 1M/1M
    python scripts/bench_console.py --database /var/tmp/large.db \\
        --events 2100 --deliveries 2100 --body-bytes 1048576                 # 1 MiB bodies
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from benchlib import (
    HOST,
    BenchError,
    admin_execute,
    free_port,
    relay_argv,
    relay_env,
    require_local,
    start_server,
    stop_server,
)

from receivers.ids import new_ids
from receivers.store import create_engine
from relay.store import migrate

USER, PASSWORD = "bench", "a password for the bench"
DESTINATIONS = ("orders", "archive", "crm", "analytics")
ORDERED = "orders"
"""The destination whose deliveries carry an order key (the console shows their line flags)."""
KINDS = (
    ("sms.dlr", "requestId", "delivered"),
    ("sms.inbound", "requestId", None),
    ("conversations.status", "messageId", "messagestatus::delivered"),
    ("tts.event", "callId", "completed"),
    ("numinfo.gnp", "requestId", None),
)
SOURCES = ("default", "partner")
STATUS_MIX = (("succeeded", 90), ("dead", 5), ("pending", 3), ("held", 2))
REJECTED_BODIES = 10_000
STORE_SPAN = timedelta(days=30)
END = datetime(2026, 11, 1, tzinfo=UTC)
CHUNK = 20_000
NOT_DUE = END + timedelta(days=3650)
"""The pending deliveries' next attempt: the embedded worker of `relay serve` leaves them be
(due, it would attempt them during the timing, and change the store between runs)."""
DEEP_PAGES = 100
WALK_BUDGET_S = 300.0
"""A walk down the pages stops after this long (a list without an index: each page sorts)."""
PAGE_BUDGET_S = 60.0
FEWEST_RUNS = 3
"""A page is timed fewer times than ``--runs`` (but this many) once it took the budget."""
DEFAULT_PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
CSRF = re.compile(r'name="csrf" value="([^"]*)"')
TOKEN = re.compile(r'name="token" value="([^"]*)"')
NEXT = re.compile(
    r'href="/console/(?:events|deliveries|quarantine)\?([^"]*before=[^"]*)" rel="next"'
)
EVENT_COLUMNS = (
    "id",
    "source",
    "kind",
    "dedup_key",
    "received_at",
    "payload",
    "raw_body",
    "content_type",
    "method",
    "remote_addr",
    "duplicates",
    "platform_id",
    "event_name",
)
DELIVERY_COLUMNS = (
    "id",
    "event_id",
    "destination",
    "policy",
    "status",
    "attempts",
    "schedule_base",
    "created_at",
    "first_attempt_at",
    "last_attempt_at",
    "next_attempt_at",
    "finished_at",
    "last_status_code",
    "last_error",
    "order_key",
    "arrived_at",
)
ATTEMPT_COLUMNS = ("delivery_id", "number", "started_at", "duration_ms", "status_code", "error")
ROUTED_COLUMNS = ("event_id", "routed_at", "deliveries")
REJECTED_COLUMNS = (
    "id",
    "source",
    "path",
    "kind",
    "status",
    "reason",
    "errors",
    "body_hash",
    "raw_body",
    "content_type",
    "remote_addr",
    "received_at",
    "last_seen_at",
    "count",
)


@dataclass(frozen=True)
class Shape:
    """What the store holds: its size is checked before reuse (a different shape refills)."""

    events: int
    deliveries: int
    body_bytes: int

    def label(self) -> str:
        return json.dumps(
            {"events": self.events, "deliveries": self.deliveries, "body_bytes": self.body_bytes}
        )


# --- the data ------------------------------------------------------------------------------------


def event_time(index: int, count: int) -> datetime:
    return END - STORE_SPAN + STORE_SPAN * index / count


def event_rows(shape: Shape, seed: int) -> Iterator[list[tuple[Any, ...]]]:
    """The events in chunks, oldest first: five kinds, two sources, a platform id each."""
    rng = random.Random(seed)
    padding = "x" * shape.body_bytes
    chunk_size = max(1, min(CHUNK, 2**26 // max(1, shape.body_bytes)))  # at most ~64 MiB
    for start in range(0, shape.events, chunk_size):
        size = min(chunk_size, shape.events - start)
        ids = new_ids(event_time(start, shape.events), size)
        chunk = []
        for offset, event_id in enumerate(ids):
            index = start + offset
            kind, field, event = KINDS[index % len(KINDS)]
            platform_id = f"id-{index:07d}"
            payload: dict[str, Any] = {
                field: platform_id,
                "status": event,
                "to": f"+49151{rng.randrange(10**7):07d}",
            }
            if padding:
                payload["text"] = padding
            text = json.dumps(payload)
            chunk.append(
                (
                    event_id,
                    SOURCES[1] if index % 7 == 0 else SOURCES[0],
                    kind,
                    f"{platform_id}|{event}" if event else platform_id,
                    event_time(index, shape.events),
                    text,
                    text.encode(),
                    "application/json",
                    "POST",
                    "127.0.0.1",
                    0,
                    platform_id,
                    event,
                )
            )
        yield chunk


def delivery_rows(
    events: Sequence[tuple[str, datetime]], count: int, seed: int
) -> Iterator[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """(deliveries, attempts) in chunks: delivery ``n`` is of event ``n % len(events)`` to the
    ``n // len(events)``-th destination after the event's own (so each pair is unique)."""
    rng = random.Random(seed + 1)
    statuses = [status for status, weight in STATUS_MIX for _ in range(weight)]
    for start in range(0, count, CHUNK):
        deliveries, attempts = [], []
        for number in range(start, min(count, start + CHUNK)):
            event_id, received = events[number % len(events)]
            destination = DESTINATIONS[
                (number % len(events) + number // len(events)) % len(DESTINATIONS)
            ]
            status = rng.choice(statuses)
            created = received + timedelta(milliseconds=5)
            tries = {"succeeded": 1, "dead": 5, "pending": rng.randint(0, 2), "held": 1}[status]
            first = created + timedelta(milliseconds=20) if tries else None
            last = created + timedelta(seconds=30 * tries) if tries else None
            code = 200 if status == "succeeded" else (503 if tries else None)
            (delivery_id,) = new_ids(created, 1)
            deliveries.append(
                (
                    delivery_id,
                    event_id,
                    destination,
                    "standard",
                    status,
                    tries,
                    0,
                    created,
                    first,
                    last,
                    NOT_DUE if status in ("pending", "held") else None,
                    last if status in ("succeeded", "dead") else None,
                    code,
                    "HTTP 503" if code == 503 else None,
                    f"+49151{rng.randrange(10**5):05d}" if destination == ORDERED else None,
                    received if destination == ORDERED else None,
                )
            )
            if status != "succeeded" or number % 10 == 0:  # attempts kept for some
                for attempt in range(1, tries + 1):
                    started = created + timedelta(seconds=30 * (attempt - 1))
                    failed = status != "succeeded" or attempt < tries
                    attempts.append(
                        (
                            delivery_id,
                            attempt,
                            started,
                            12.5,
                            503 if failed else 200,
                            None,
                        )
                    )
        yield deliveries, attempts


def rejected_rows(count: int) -> list[tuple[Any, ...]]:
    rows = []
    for index, rejected_id in enumerate(new_ids(END - STORE_SPAN, count)):
        seen = event_time(index, count)
        body = f'{{"broken": {index}'.encode()
        rows.append(
            (
                rejected_id,
                "default",
                "/hooks/sms/dlr",
                "sms.dlr",
                400,
                "the body is not JSON",
                "[]",
                f"sha256:{index:064x}",
                body,
                "application/json",
                "127.0.0.1",
                seen,
                seen,
                1,
            )
        )
    return rows


def sqlite_time(moment: datetime) -> str:
    """A time as the store keeps it in SQLite (naive UTC, microseconds)."""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def for_sqlite(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [
        tuple(sqlite_time(value) if isinstance(value, datetime) else value for value in row)
        for row in rows
    ]


def insert_sql(table: str, columns: Sequence[str]) -> str:
    marks = ", ".join("?" for _ in columns)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


# --- the stores ----------------------------------------------------------------------------------


class SqliteStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"

    def shape(self) -> str | None:
        if not self.path.exists():
            return None
        with sqlite3.connect(self.path) as conn:
            try:
                return str(conn.execute("SELECT value FROM bench_shape").fetchone()[0])
            except (sqlite3.Error, TypeError):
                return None

    def empty(self) -> None:
        self.path.unlink(missing_ok=True)

    def fill(self, shape: Shape, seed: int) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute("PRAGMA synchronous = OFF")
            events: list[tuple[str, datetime]] = []
            for chunk in event_rows(shape, seed):
                conn.executemany(insert_sql("received_events", EVENT_COLUMNS), for_sqlite(chunk))
                conn.executemany(
                    insert_sql("routed_events", ROUTED_COLUMNS),
                    for_sqlite([(row[0], row[4], 1) for row in chunk]),
                )
                events += [(row[0], row[4]) for row in chunk]
            conn.commit()
            progress(f"{shape.events:,} events")
            for deliveries, attempts in delivery_rows(events, shape.deliveries, seed):
                conn.executemany(insert_sql("deliveries", DELIVERY_COLUMNS), for_sqlite(deliveries))
                conn.executemany(
                    insert_sql("delivery_attempts", ATTEMPT_COLUMNS), for_sqlite(attempts)
                )
            conn.executemany(
                insert_sql("rejected_bodies", REJECTED_COLUMNS),
                for_sqlite(rejected_rows(REJECTED_BODIES)),
            )
            conn.execute("CREATE TABLE bench_shape (value TEXT)")
            conn.execute("INSERT INTO bench_shape VALUES (?)", (shape.label(),))
            conn.commit()
            conn.execute("ANALYZE")

    def size_mb(self) -> float:
        return round(self.path.stat().st_size / 2**20, 1)


class PostgresStore:
    def __init__(self, admin_dsn: str, database: str) -> None:
        self.admin_dsn = admin_dsn
        self.database = database
        self.dsn = f"{admin_dsn.rsplit('/', 1)[0]}/{database}"
        self.url = self.dsn.replace("postgresql://", "postgresql+asyncpg://", 1)

    def shape(self) -> str | None:
        async def read() -> str | None:
            try:
                conn = await asyncpg.connect(self.dsn, timeout=10)
            except asyncpg.InvalidCatalogNameError:
                return None
            try:
                return await conn.fetchval("SELECT value FROM bench_shape")  # type: ignore[no-any-return]
            except asyncpg.UndefinedTableError:
                return None
            finally:
                await conn.close()

        return asyncio.run(read())

    def empty(self) -> None:
        async def recreate() -> None:
            await admin_execute(self.admin_dsn, f'DROP DATABASE IF EXISTS "{self.database}"')
            await admin_execute(self.admin_dsn, f'CREATE DATABASE "{self.database}"')

        asyncio.run(recreate())

    def fill(self, shape: Shape, seed: int) -> None:
        asyncio.run(self._fill(shape, seed))

    async def _fill(self, shape: Shape, seed: int) -> None:
        conn = await asyncpg.connect(self.dsn, timeout=10)
        try:
            events: list[tuple[str, datetime]] = []
            for chunk in event_rows(shape, seed):
                await conn.copy_records_to_table(
                    "received_events", records=chunk, columns=EVENT_COLUMNS
                )
                await conn.copy_records_to_table(
                    "routed_events",
                    records=[(row[0], row[4], 1) for row in chunk],
                    columns=ROUTED_COLUMNS,
                )
                events += [(row[0], row[4]) for row in chunk]
            progress(f"{shape.events:,} events")
            for deliveries, attempts in delivery_rows(events, shape.deliveries, seed):
                await conn.copy_records_to_table(
                    "deliveries", records=deliveries, columns=DELIVERY_COLUMNS
                )
                await conn.copy_records_to_table(
                    "delivery_attempts", records=attempts, columns=ATTEMPT_COLUMNS
                )
            await conn.copy_records_to_table(
                "rejected_bodies",
                records=rejected_rows(REJECTED_BODIES),
                columns=REJECTED_COLUMNS,
            )
            await conn.execute("CREATE TABLE bench_shape (value text)")
            await conn.execute("INSERT INTO bench_shape VALUES ($1)", shape.label())
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()

    def size_mb(self) -> float:
        async def size() -> float:
            conn = await asyncpg.connect(self.dsn, timeout=10)
            try:
                return float(await conn.fetchval("SELECT pg_database_size(current_database())"))
            finally:
                await conn.close()

        return round(asyncio.run(size()) / 2**20, 1)


Store = SqliteStore | PostgresStore


def progress(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')}  {text}", file=sys.stderr, flush=True)


def upgrade(url: str) -> float:
    """Bring the store to this code's head revision; the seconds it took."""

    async def run() -> None:
        engine = create_engine(url)
        try:
            await migrate.upgrade(engine)
        finally:
            await engine.dispose()

    started = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - started


def prepare(store: Store, shape: Shape, seed: int) -> float:
    """Fill the store unless it holds ``shape`` already; migrate it; the migration's seconds."""
    if store.shape() != shape.label():
        progress(f"filling {store.url} ...")
        started = time.perf_counter()
        store.empty()
        upgrade(store.url)
        store.fill(shape, seed)
        progress(f"filled in {time.perf_counter() - started:.0f} s")
    return upgrade(store.url)


# --- timing --------------------------------------------------------------------------------------


def timed(
    client: httpx.Client, method: str, path: str, runs: int, **options: object
) -> list[float]:
    """Milliseconds of ``runs`` requests (each must answer 200); fewer (at least
    :data:`FEWEST_RUNS`) once they took :data:`PAGE_BUDGET_S` together (a page of seconds)."""
    latencies: list[float] = []
    for _ in range(runs):
        if len(latencies) >= FEWEST_RUNS and sum(latencies) > PAGE_BUDGET_S * 1000:
            break
        started = time.perf_counter_ns()
        answer = client.request(method, path, **options)  # type: ignore[arg-type]
        latencies.append((time.perf_counter_ns() - started) / 1e6)
        if answer.status_code != 200:
            raise SystemExit(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
    return sorted(latencies)


def login(client: httpx.Client) -> str:
    form = client.get("/console/login")
    token = TOKEN.search(form.text)
    assert token is not None
    answer = client.post(
        "/console/login", data={"token": token[1], "user": USER, "password": PASSWORD}
    )
    if answer.status_code != 303:
        raise SystemExit(f"login failed: {answer.status_code}")
    page = client.get("/console/events")
    csrf = CSRF.search(page.text)
    assert csrf is not None
    return csrf[1]


def deep_query(client: httpx.Client, path: str, pages: int) -> tuple[str, int, float]:
    """The query string of the page ``pages`` pages down from ``path`` (following each page's
    "Older" link), how many pages down it is (fewer at the last page, or once the walk took
    :data:`WALK_BUDGET_S`) and the milliseconds the walk took."""
    query = path.partition("?")[2]
    base = path.partition("?")[0]
    started = time.perf_counter()
    for walked in range(pages):
        if time.perf_counter() - started > WALK_BUDGET_S:
            return query, walked, (time.perf_counter() - started) * 1000
        found = NEXT.search(client.get(f"{base}?{query}").text)
        if found is None:  # the last page
            return query, walked, (time.perf_counter() - started) * 1000
        query = found[1].replace("&amp;", "&")
    return query, pages, (time.perf_counter() - started) * 1000


def minute(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M")


def pages_to_time(shape: Shape) -> dict[str, str]:
    middle = END - STORE_SPAN / 2
    hour = f"since={minute(middle)}&until={minute(middle + timedelta(hours=1))}"
    day = f"since={minute(END - timedelta(days=1))}"
    return {
        "events, newest": "/console/events",
        "events, by kind": "/console/events?kind=sms.inbound",
        "events, by source": "/console/events?source=partner",
        "events, by platform id": f"/console/events?q=id-{shape.events // 2:07d}",
        "events, by event name": "/console/events?event=completed",
        "events, one hour": f"/console/events?{hour}",
        "events, combined": f"/console/events?source=partner&kind=sms.dlr&event=delivered&{day}",
        "deliveries, unfiltered": "/console/deliveries",
        "deliveries, dead": "/console/deliveries?status=dead",
        "deliveries, held": "/console/deliveries?status=held",
        "deliveries, one destination": "/console/deliveries?destination=crm",
        "deliveries, since": f"/console/deliveries?since={minute(middle)}",
        "deliveries, one hour": f"/console/deliveries?{hour}",
        "deliveries, combined": f"/console/deliveries?status=dead&destination=orders&{day}",
        "quarantine": "/console/quarantine",
        "destinations": "/console/destinations",
    }


DEEP = {
    "events, 100 pages deep": "/console/events",
    "events by kind, 100 pages deep": "/console/events?kind=sms.inbound",
    "deliveries, 100 pages deep": "/console/deliveries",
    "deliveries dead, 100 pages deep": "/console/deliveries?status=dead",
    "quarantine, 100 pages deep": "/console/quarantine",
}


def measure(url: str, shape: Shape, runs: int, deep: int) -> dict[str, dict[str, float]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-console-"))
    config = workdir / "relay.toml"
    destinations = "\n".join(
        f'[destinations.{name}]\ntype = "http"\nurl = "http://{HOST}:9/"\n'
        + ('ordering = "per-key"\n' if name == ORDERED else "")
        for name in DESTINATIONS
    )
    sources = "\n".join(
        f'[sources.{name}]\ntoken = "a token for the bench: {name}"\n' for name in SOURCES
    )
    config.write_text(
        f'database_url = "{url}"\n[console.users]\n{USER} = "{PASSWORD}"\n' + destinations + sources
    )
    port = free_port()
    server = start_server("relay", relay_argv(port, config), port, workdir, relay_env())
    results: dict[str, dict[str, float]] = {}
    try:
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=120) as client:
            for _ in range(1200):
                if server.process.poll() is not None:
                    raise SystemExit(f"relay serve stopped: {server.log_tail()}")
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            csrf = login(client)
            baseline = timed(client, "GET", "/healthz", runs * 2)
            results["baseline: /healthz"] = summary(baseline, baseline)
            for name, path in pages_to_time(shape).items():
                results[name] = summary(timed(client, "GET", path, runs), baseline)
                progress(f"{name}: {results[name]['median_ms']} ms")
            for name, path in DEEP.items():
                query, walked, walk_ms = deep_query(client, path, deep)
                base = path.partition("?")[0]
                results[name] = summary(timed(client, "GET", f"{base}?{query}", runs), baseline)
                results[name].update(walk_ms=round(walk_ms, 1), walked=walked)
                progress(
                    f"{name}: {results[name]['median_ms']} ms "
                    f"({walked} pages walked in {walk_ms:.0f} ms)"
                )
            for name, form in {
                "bulk replay: count all dead": {"destination": ""},
                "bulk replay: count one destination, a day": {
                    "destination": "orders",
                    "since": minute(END - timedelta(days=1)),
                },
            }.items():
                count = timed(
                    client, "POST", "/console/deliveries/replay", runs, data={"csrf": csrf, **form}
                )
                results[name] = summary(count, baseline)
    finally:
        stop_server(server)
    return results


def summary(latencies: list[float], baseline: list[float]) -> dict[str, float]:
    median = statistics.median(latencies)
    return {
        "median_ms": round(median, 2),
        "p95_ms": round(latencies[max(0, int(len(latencies) * 0.95) - 1)], 2),
        "ratio": round(median / statistics.median(baseline), 2),
        "runs": len(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    parser.add_argument(
        "--body-bytes", type=int, default=0, help="pad each event's body to about this size"
    )
    parser.add_argument("--runs", type=int, default=15, help="requests per page")
    parser.add_argument("--deep", type=int, default=DEEP_PAGES, help="pages to walk down")
    parser.add_argument("--database", type=Path, help="SQLite: the store file (kept)")
    parser.add_argument("--pg-admin-dsn", default=DEFAULT_PG_ADMIN_DSN)
    parser.add_argument(
        "--pg-database", default="bench_console", help="PostgreSQL: the store's database (kept)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--fill-only", action="store_true", help="fill and migrate, time nothing")
    args = parser.parse_args()
    if args.deliveries > args.events * len(DESTINATIONS):
        parser.error(f"at most {len(DESTINATIONS)} deliveries per event")

    shape = Shape(args.events, args.deliveries, args.body_bytes)
    store: Store
    if args.backend == "sqlite":
        default = Path(tempfile.mkdtemp(prefix="bench-console-")) / "relay.db"
        store = SqliteStore(args.database or default)
    else:
        try:
            require_local(args.pg_admin_dsn, "PostgreSQL")
        except BenchError as exc:
            raise SystemExit(str(exc)) from None
        store = PostgresStore(args.pg_admin_dsn, args.pg_database)
    migrated_s = prepare(store, shape, args.seed)
    progress(f"schema at head in {migrated_s:.1f} s")
    if args.fill_only:
        return
    results = measure(store.url, shape, args.runs, args.deep)
    if args.json:
        document = {
            "backend": args.backend,
            **json.loads(shape.label()),
            "store_mb": store.size_mb(),
            "migrated_s": round(migrated_s, 2),
            "pages": results,
        }
        print(json.dumps(document))
        return
    print(
        f"{args.backend}: {shape.events:,} events, {shape.deliveries:,} deliveries, "
        f"bodies {shape.body_bytes or 'small'} bytes, store {store.size_mb()} MB, "
        f"schema brought to head in {migrated_s:.1f} s, up to {args.runs} requests per page"
    )
    print(f"{'page':<44} {'median ms':>10} {'p95 ms':>8} {'ratio':>7}")
    for name, figures in results.items():
        walk = (
            f"  ({figures['walked']:.0f} pages walked in {figures['walk_ms']:.0f} ms)"
            if "walk_ms" in figures
            else ""
        )
        print(
            f"{name:<44} {figures['median_ms']:>10.1f} {figures['p95_ms']:>8.1f} "
            f"{figures['ratio']:>7.1f}{walk}"
        )


if __name__ == "__main__":
    main()
