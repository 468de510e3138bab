"""Scrapers benchmark: what scrapers of ``/metrics`` cost the valid callbacks, next to none.

For each backend (``--backends``, default PostgreSQL and SQLite), on a fresh store filled with
``--deliveries`` (206,000) deliveries to four destinations, a share ``--pending`` of them pending
and not due for an hour (a destination that has been failing), ``--dead`` dead, the rest
succeeded, each with its received event (realistic bodies from the simulator's factories):

1. the store's figures are read directly, ``outbox.store_figures`` five times (the median: what
   one read of the deliveries' backlog costs the database);
2. one `relay serve` (embedded worker, ``--log-level warning``, no access log) is started on that
   store; its destinations take only a kind the load never sends, so the callbacks make no new
   deliveries and the worker stays idle;
3. ``--rounds`` turns of ``--requests`` valid callbacks each (distinct bodies, ``--concurrency``
   keep-alive connections, one request in flight on each; ``benchlib``'s load generator), played
   alone, with scrapers, with scrapers, alone, ...: in a turn with scrapers, ``--scrapers``
   keep-alive connections GET ``/metrics`` at ``--scrape-rate`` scrapes/s in all (each waits for
   its answer: a scraper whose scrape takes longer than its share of the rate scrapes as fast as
   it is answered). The scrapers start before the callbacks and stop after them.

Printed per backend: the direct read's time, the callbacks' p50/p99 (send to complete answer,
2xx only) alone and with scrapers, the ratios with / alone (1.0: scrapers cost nothing), the
scrapes answered per second and their p50, and the warnings the server logged about reading the
figures. The exit status is 1 when a callback was not answered 2xx, 2 when the run failed.

Before/after: run the same script with another checkout first on ``PYTHONPATH`` (the server
subprocess and ``relay db upgrade`` import ``relay`` from there)::

    python scripts/bench_scrapers.py [--backends postgresql,sqlite] [--scrapers 32] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import harness
from bench_backlog import DELIVERY_COLUMNS, EVENT_COLUMNS, ROUTED_COLUMNS, Body, body_pool
from benchlib import (
    HOST,
    BenchError,
    Server,
    admin_execute,
    at_least,
    build_events,
    close_connections,
    drive,
    encode_requests,
    free_port,
    loop_factory,
    open_connections,
    percentile_ms,
    relay_argv,
    relay_command,
    relay_env,
    require_local,
    sigterm_interrupts,
    start_server,
    stop_server,
    wait_ready,
)

from receivers.store import create_engine, new_id
from relay import outbox

DEFAULT_PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DESTINATIONS = ("crm", "billing", "reports", "archive")
UNSENT_KIND = "numinfo.gnv"
"""The one kind the destinations take: the load (``benchlib.KIND_MIX``) never sends it."""
READ_FAILURE = "cannot read the store's figures"


# --- the store -----------------------------------------------------------------------------------


Rows = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]


def store_rows(args: argparse.Namespace, bodies: Sequence[Body], now: datetime) -> Rows:
    """(received_events, routed_events, deliveries) rows: received over the last day; pending
    ones failed once and wait an hour or more, dead and succeeded ones are finished."""
    rng = random.Random(args.seed)
    events, routed, deliveries = [], [], []
    for number in range(args.deliveries):
        body = bodies[number % len(bodies)]
        received = now - timedelta(seconds=rng.uniform(60, 86_400))
        event_id = new_id(received)
        events.append(
            (event_id, "default", body.kind, f"bench:{number}", received, body.payload, body.raw)
            + ("application/json", "POST", HOST, 0)
            + (None,) * (len(EVENT_COLUMNS) - 11)
        )
        routed.append((event_id, received, 1))
        draw = rng.random()
        status = (
            "pending"
            if draw < args.pending
            else "dead"
            if draw < args.pending + args.dead
            else "succeeded"
        )
        next_at = (
            now + timedelta(seconds=rng.uniform(3600, 36_000)) if status == "pending" else None
        )
        code, error = (200, None) if status == "succeeded" else (503, "HTTP 503")
        times = (received, received, received, next_at)
        destination = DESTINATIONS[number % len(DESTINATIONS)]
        deliveries.append(
            (
                new_id(received),
                event_id,
                destination,
                body.policy,
                status,
                1,
                0,
                *times,
                code,
                error,
            )
        )
    return events, routed, deliveries


async def fill_postgres(dsn: str, rows: Rows) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        async with conn.transaction():
            for table, columns, records in zip(
                ("received_events", "routed_events", "deliveries"),
                (EVENT_COLUMNS, ROUTED_COLUMNS, DELIVERY_COLUMNS),
                rows,
                strict=True,
            ):
                await conn.copy_records_to_table(table, records=records, columns=columns)
        await conn.execute("VACUUM ANALYZE received_events, routed_events, deliveries")
    finally:
        await conn.close()


def sqlite_value(value: Any) -> Any:
    """A value as the store keeps it in SQLite (times: naive UTC text)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")
    return value


def fill_sqlite(path: Path, rows: Rows) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA synchronous = OFF")
        for table, columns, records in zip(
            ("received_events", "routed_events", "deliveries"),
            (EVENT_COLUMNS, ROUTED_COLUMNS, DELIVERY_COLUMNS),
            rows,
            strict=True,
        ):
            marks = ", ".join("?" * len(columns))
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                ([sqlite_value(value) for value in record] for record in records),
            )
        conn.commit()
        conn.execute("ANALYZE")


def write_config(workdir: Path, database_url: str, token: str) -> Path:
    config = workdir / "relay.toml"
    lines = [f'database_url = "{database_url}"', "[console]", "enabled = false"]
    lines += [f'[sources.default]\ntoken = "{token}"']
    for name in DESTINATIONS:
        lines += [f'[destinations.{name}]\ntype = "http"\nurl = "http://{HOST}:9/"']
        lines += [f'kinds = ["{UNSENT_KIND}"]']
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config


CREATED_DATABASES: list[str] = []
"""Databases created and not dropped yet (``run`` drops what is left on the way out)."""


@contextlib.asynccontextmanager
async def fresh_database(
    admin_dsn: str, workdir: Path, config_for: Callable[[str], Path]
) -> AsyncIterator[tuple[str, Path]]:
    """A new database, migrated with `relay db upgrade`; dropped on the way out."""
    database = f"scrapers_{secrets.token_hex(6)}"
    dsn = f"{admin_dsn.rsplit('/', 1)[0]}/{database}"
    await admin_execute(admin_dsn, f'CREATE DATABASE "{database}"')
    CREATED_DATABASES.append(database)
    try:
        config = config_for(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
        await asyncio.to_thread(upgrade, config, workdir)
        yield dsn, config
    finally:
        await asyncio.shield(drop_database(admin_dsn, database))


async def drop_database(admin_dsn: str, database: str) -> None:
    await admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    CREATED_DATABASES.remove(database)


def upgrade(config: Path, workdir: Path) -> None:
    result = subprocess.run(
        [*relay_command(), "db", "upgrade", "--config", str(config)],
        cwd=workdir,
        env=relay_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"relay db upgrade failed:\n{result.stdout}{result.stderr}")


async def direct_read_ms(database_url: str) -> float:
    """The median time of five reads of the store's figures, as `relay serve` makes them."""
    engine = create_engine(database_url)
    try:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            await outbox.store_figures(engine)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)
    finally:
        await engine.dispose()


# --- the load ------------------------------------------------------------------------------------


@dataclass
class Scrapers:
    """``count`` keep-alive scrapers of ``/metrics``, ``rate`` scrapes/s in all, until stopped."""

    port: int
    count: int
    rate: float
    latencies_ns: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stopping: bool = False
    seconds: float = 0.0
    """From the first scraper's start to the last one's stop."""

    async def run(self, started: asyncio.Event) -> None:
        began = time.perf_counter()
        try:
            await self._run(started)
        finally:
            self.seconds = time.perf_counter() - began

    async def _run(self, started: asyncio.Event) -> None:
        ready = [asyncio.Event() for _ in range(self.count)]
        tasks = [
            asyncio.create_task(self.scrape(number, event)) for number, event in enumerate(ready)
        ]
        await asyncio.gather(*(event.wait() for event in ready))
        started.set()
        await asyncio.gather(*tasks)

    async def scrape(self, number: int, ready: asyncio.Event) -> None:
        request = f"GET /metrics HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n\r\n".encode()
        period = self.count / self.rate if self.rate > 0 else 0.0
        reader, writer = await asyncio.open_connection(HOST, self.port)
        next_at = time.monotonic() + period * number / self.count  # spread over the period
        try:
            while not self.stopping:
                await asyncio.sleep(max(next_at - time.monotonic(), 0))
                next_at += period
                sent = time.perf_counter_ns()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                await reader.readexactly(length)
                if not head.startswith(b"HTTP/1.1 200 "):
                    self.failures.append(head.split(b"\r\n", 1)[0].decode())
                self.latencies_ns.append(time.perf_counter_ns() - sent)
                ready.set()
        finally:
            writer.close()


@dataclass
class Turn:
    scraped: bool
    latencies_ns: list[int]
    statuses: list[int]
    seconds: float
    scrapes: int = 0
    scrape_seconds: float = 0.0
    scrape_latencies_ns: list[int] = field(default_factory=list)
    scrape_failures: list[str] = field(default_factory=list)


async def play_turn(
    port: int, requests: Sequence[bytes], args: argparse.Namespace, *, scraped: bool
) -> Turn:
    connections = await open_connections(port, args.concurrency)
    scrapers = Scrapers(port, args.scrapers, args.scrape_rate) if scraped else None
    running: asyncio.Task[None] | None = None
    try:
        if scrapers is not None:
            started = asyncio.Event()
            running = asyncio.create_task(scrapers.run(started))
            await asyncio.wait(
                [asyncio.create_task(started.wait()), running],
                return_when=asyncio.FIRST_COMPLETED,
            )
            if running.done():
                running.result()  # the scrapers failed before the callbacks: their error
        phase = await drive(connections, requests, keep_bodies=False)
    finally:
        close_connections(connections)
        if scrapers is not None and running is not None:
            scrapers.stopping = True
            await running
    turn = Turn(
        scraped,
        sorted(
            ns
            for ns, status in zip(phase.latencies_ns, phase.statuses, strict=True)
            if 200 <= status < 300
        ),
        list(phase.statuses),
        phase.finished_at - phase.started_at,
    )
    if scrapers is not None:
        turn.scrapes = len(scrapers.latencies_ns)
        turn.scrape_seconds = scrapers.seconds
        turn.scrape_latencies_ns = sorted(scrapers.latencies_ns)
        turn.scrape_failures = scrapers.failures
    return turn


# --- one backend ---------------------------------------------------------------------------------


@dataclass
class BackendResult:
    backend: str
    deliveries: int
    pending: int
    dead: int
    direct_read_ms: float
    alone_p50_ms: float
    alone_p99_ms: float
    scraped_p50_ms: float
    scraped_p99_ms: float
    scrapes_per_s: float
    scrape_p50_ms: float
    not_2xx: int
    scrape_failures: int
    read_warnings: int

    @property
    def p50_ratio(self) -> float:
        return self.scraped_p50_ms / self.alone_p50_ms

    @property
    def p99_ratio(self) -> float:
        return self.scraped_p99_ms / self.alone_p99_ms

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"p50_ratio": self.p50_ratio, "p99_ratio": self.p99_ratio}


def summarize(
    backend: str, rows: Rows, read_ms: float, turns: list[Turn], log: str
) -> BackendResult:
    alone = sorted(ns for turn in turns if not turn.scraped for ns in turn.latencies_ns)
    scraped = sorted(ns for turn in turns if turn.scraped for ns in turn.latencies_ns)
    scrape_ns = sorted(ns for turn in turns for ns in turn.scrape_latencies_ns)
    scraped_seconds = sum(turn.scrape_seconds for turn in turns if turn.scraped)
    statuses = [status for turn in turns for status in turn.statuses]
    deliveries = rows[2]
    return BackendResult(
        backend=backend,
        deliveries=len(deliveries),
        pending=sum(row[4] == "pending" for row in deliveries),
        dead=sum(row[4] == "dead" for row in deliveries),
        direct_read_ms=read_ms,
        alone_p50_ms=percentile_ms(alone, 0.50),
        alone_p99_ms=percentile_ms(alone, 0.99),
        scraped_p50_ms=percentile_ms(scraped, 0.50),
        scraped_p99_ms=percentile_ms(scraped, 0.99),
        scrapes_per_s=sum(turn.scrapes for turn in turns) / scraped_seconds
        if scraped_seconds
        else math.nan,
        scrape_p50_ms=percentile_ms(scrape_ns, 0.50),
        not_2xx=sum(not 200 <= status < 300 for status in statuses),
        scrape_failures=sum(len(turn.scrape_failures) for turn in turns),
        read_warnings=log.count(READ_FAILURE),
    )


async def measure_backend(
    backend: str,
    args: argparse.Namespace,
    bodies: Sequence[Body],
    workdir: Path,
    servers: list[Server],
) -> BackendResult:
    token = secrets.token_urlsafe(24)
    directory = workdir / backend
    directory.mkdir()
    note(f"{backend}: filling the store with {args.deliveries:,} deliveries")
    rows = store_rows(args, bodies, datetime.now(UTC))
    if backend == "postgresql":

        def config_for(url: str) -> Path:
            return write_config(directory, url, token)

        async with fresh_database(args.pg_admin_dsn, directory, config_for) as (dsn, config):
            await fill_postgres(dsn, rows)
            database_url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
            return await measure_server(
                backend, args, rows, database_url, config, directory, token, servers
            )
    database_url = f"sqlite:///{directory / 'relay.db'}"
    config = write_config(directory, database_url, token)
    await asyncio.to_thread(upgrade, config, directory)
    await asyncio.to_thread(fill_sqlite, directory / "relay.db", rows)
    return await measure_server(
        backend, args, rows, database_url, config, directory, token, servers
    )


async def measure_server(
    backend: str,
    args: argparse.Namespace,
    rows: Rows,
    database_url: str,
    config: Path,
    directory: Path,
    token: str,
    servers: list[Server],
) -> BackendResult:
    read_ms = await direct_read_ms(database_url)
    note(f"{backend}: one read of the store's figures takes {read_ms:.1f} ms")
    port = free_port()
    server = start_server(
        f"serve-{backend}", relay_argv(port, config), port, directory, relay_env()
    )
    servers.append(server)
    try:
        await wait_ready(server, "/readyz")
        events = build_events(args.requests * (args.rounds + 1), args.seed + 1)
        requests = encode_requests(events, port, token, user_agent="bench-scrapers")
        turns = []
        await play_turn(port, requests[: args.requests], args, scraped=False)  # warm-up
        for number in range(args.rounds):
            chunk = requests[(number + 1) * args.requests : (number + 2) * args.requests]
            scraped = number % 4 in (1, 2)
            turn = await play_turn(port, chunk, args, scraped=scraped)
            note(
                f"{backend}: turn {number + 1} {'with scrapers' if scraped else 'alone'}: "
                f"p50 {percentile_ms(turn.latencies_ns, 0.5):.1f} ms"
                + (f", {turn.scrapes} scrapes" if scraped else "")
            )
            turns.append(turn)
    finally:
        stop_server(server)
        servers.remove(server)
    return summarize(backend, rows, read_ms, turns, server.log_path.read_text(errors="replace"))


# --- the run -------------------------------------------------------------------------------------


def note(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')}  {text}", file=sys.stderr, flush=True)


def as_text(results: Sequence[BackendResult], args: argparse.Namespace) -> str:
    lines = [
        f"{args.scrapers} scrapers at {args.scrape_rate:g} scrapes/s in all; "
        f"{args.rounds} turns of {args.requests} callbacks, {args.concurrency} connections",
        "backend     deliveries  pending  dead    read ms  alone p50/p99 ms  scraped p50/p99 ms  "
        "ratio p50/p99  scrapes/s  scrape p50 ms  warnings",
    ]
    for r in results:
        lines.append(
            f"{r.backend:<11} {r.deliveries:>10,} {r.pending:>8,} {r.dead:>5,}"
            f" {r.direct_read_ms:>10.1f}"
            f"  {r.alone_p50_ms:>7.1f} / {r.alone_p99_ms:<7.1f}  {r.scraped_p50_ms:>8.1f} / "
            f"{r.scraped_p99_ms:<8.1f}  {r.p50_ratio:>5.2f} / {r.p99_ratio:<5.2f}  "
            f"{r.scrapes_per_s:>9.1f}  {r.scrape_p50_ms:>13.1f}  {r.read_warnings:>8}"
        )
        if r.not_2xx or r.scrape_failures:
            lines.append(
                f"  problems: {r.not_2xx} callbacks not 2xx, {r.scrape_failures} failed scrapes"
            )
    return "\n".join(lines)


async def run_async(
    args: argparse.Namespace, workdir: Path, servers: list[Server]
) -> list[BackendResult]:
    bodies = await asyncio.to_thread(body_pool, args.seed)
    return [
        await measure_backend(backend, args, bodies, workdir, servers) for backend in args.backends
    ]


def run(args: argparse.Namespace, workdir: Path) -> list[BackendResult]:
    servers: list[Server] = []

    async def bounded() -> list[BackendResult]:
        try:
            async with asyncio.timeout(args.timeout):
                return await run_async(args, workdir, servers)
        except TimeoutError:
            raise BenchError("the run took longer than --timeout") from None

    with sigterm_interrupts():
        try:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                return runner.run(bounded())
        finally:
            for server in servers:
                stop_server(server)
            for database in list(CREATED_DATABASES):  # only when the run was cut short
                asyncio.run(drop_database(args.pg_admin_dsn, database))


def parse_backends(text: str) -> list[str]:
    backends = [part.strip() for part in text.split(",") if part.strip()]
    if not backends or not set(backends) <= {"postgresql", "sqlite"}:
        raise argparse.ArgumentTypeError("postgresql, sqlite or both, comma-separated")
    return backends


def share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("a share from 0 to 1")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", type=parse_backends, default=["postgresql", "sqlite"])
    parser.add_argument("--deliveries", type=at_least(1), default=206_000)
    parser.add_argument("--pending", type=share, default=0.25, help="share of pending deliveries")
    parser.add_argument("--dead", type=share, default=0.03, help="share of dead deliveries")
    parser.add_argument("--scrapers", type=at_least(1), default=32)
    parser.add_argument(
        "--scrape-rate", type=float, default=23.0, help="scrapes/s in all; 0: as fast as answered"
    )
    parser.add_argument("--requests", type=at_least(1), default=2000, help="callbacks per turn")
    parser.add_argument("--rounds", type=at_least(2), default=8, help="turns (alone, scraped, ...)")
    parser.add_argument("--concurrency", type=at_least(1), default=8, help="callback connections")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seed", type=int, default=20260301, help="data generator seed")
    parser.add_argument("--timeout", type=float, default=1800.0, help="overall limit, seconds")
    parser.add_argument(
        "--pg-admin-dsn",
        default=os.environ.get("RELAY_TEST_PG_DSN", DEFAULT_PG_ADMIN_DSN),
        help="where to CREATE and DROP the run's database",
    )
    args = parser.parse_args(argv)
    if args.pending + args.dead > 1:
        parser.error("--pending and --dead add up to more than 1")
    return args


@dataclass
class Report:
    args: argparse.Namespace
    results: list[BackendResult]

    @property
    def problems(self) -> list[str]:
        return [f"{r.backend}: {r.not_2xx} callbacks not 2xx, {r.scrape_failures} scrapes "
                "failed" for r in self.results if r.not_2xx or r.scrape_failures]  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return {"args": vars(self.args), "results": [r.as_json() for r in self.results]}

    def as_text(self) -> str:
        return as_text(self.results, self.args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def run_in_tmp() -> Report:
        require_local(args.pg_admin_dsn, "PostgreSQL")
        with tempfile.TemporaryDirectory(prefix="scrapers-") as tmp:
            return Report(args, run(args, Path(tmp)))

    return harness.run_main("bench_scrapers", run_in_tmp, args.json)


if __name__ == "__main__":
    sys.exit(main())
