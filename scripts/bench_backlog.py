"""Backlog benchmark: how the relay's SQL work grows when 10x more deliveries are pending.

For each backlog size B (``--sizes``, default 10,000 and 100,000), on a fresh PostgreSQL database
``backlog_<random>`` (created through ``--pg-admin-dsn``, migrated with ``relay db upgrade``,
dropped at the end):

1. B pending deliveries that are NOT due (``next_attempt_at`` 10 min to 10 h ahead, 1-5 failed
   attempts made: a destination that has been failing), with their ``received_events`` (realistic
   bodies from the simulator's factories) and ``routed_events`` rows, are written with COPY, then
   ``VACUUM ANALYZE`` (what autovacuum would soon do);
2. (a) one sweep with nothing due, timed ``--repeat`` times (median): ``Sweeper.sweep`` of a
   worker built by ``relay.server.services.worker_services`` from the run's config, on a real Redis
   database (``--redis-url``, default ``redis://127.0.0.1:6379/13``); also its two queries alone
   (``outbox.unrouted_events``, ``outbox.due_deliveries``);
3. ``--due`` (1,000) deliveries that are due now are added (COPY again, with their events);
   (b) one sweep when they are due and have no job (the Redis database flushed before each
   repeat: every sweep enqueues all of them), and one sweep when their jobs are queued (only
   the ZSCORE check);
4. EXPLAIN (ANALYZE, BUFFERS) of the due-deliveries query exactly as ``outbox.due_deliveries``
   sends it (captured from the engine), with nothing due and with 1,000 due, and of the
   unrouted-events query: the plan, its time, and whether ``ix_deliveries_due`` is used;
5. (c) the 1,000 due deliveries claimed, attempted and recorded by the worker's
   ``relay.delivery.deliverer.Deliverer`` (``attempt(id)``: a claim, POST to the recording sink
   ``scripts/sink_app.py``, a record; concurrent attempts share those transactions),
   ``--concurrency`` (50, the default
   ``worker_concurrency``) at once, without arq in between: deliveries/s and p50/p99 per
   attempt. The sink must have all of them and SQL must say succeeded.

The report: a table of B against those figures and the growth factor (largest / smallest B);
``--json`` prints one object. The exit status is 1 when a check failed (a sweep enqueued the wrong
number of jobs, a delivery was not recorded as succeeded or never reached the sink), 2 when the
run itself failed. The databases, the Redis database and the sink are cleaned up on every path,
Ctrl-C and SIGTERM included.

Run it with the project's interpreter (PostgreSQL and Redis on 127.0.0.1)::

    python scripts/bench_backlog.py [--sizes 10000,100000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
from arq.connections import RedisSettings, create_pool
from benchlib import (
    HOST,
    BenchError,
    Server,
    admin_execute,
    at_least,
    build_events,
    free_port,
    relay_command,
    relay_env,
    require_local,
    sigterm_interrupts,
    start_server,
    stop_server,
    uvicorn_argv,
    wait_ready,
)
from harness import machine_cpu
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import ReceivedEvent, create_engine, new_id, utc_now
from relay import outbox
from relay.dispatch.jobs import QUEUE_NAME
from relay.outbox.router import PLATFORM_POLICY, Router
from relay.outbox.sweeper import BATCH, ROUTE_GRACE
from relay.server.services import WorkerServices, worker_services
from relay.settings import load_settings

T = TypeVar("T")

DEFAULT_PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
SOURCE = "default"
DESTINATION = "sink"
SINK_PATH = "/relay"
DUE_INDEX = "ix_deliveries_due"
BODY_POOL = 5000  # distinct bodies, reused round-robin (each event still has its own dedup key)
KIND_BY_PATH = {
    "/sms/dlr": "sms.dlr",
    "/sms/inbound": "sms.inbound",
    "/numinfo/gnp": "numinfo.gnp",
    "/conversations": "conversations.status",  # KIND_MIX only sends MessageStatus events there
    "/tts/events": "tts.event",
}
EVENT_COLUMNS = [column.name for column in ReceivedEvent.__table__.columns]
ROUTED_COLUMNS = ["event_id", "routed_at", "deliveries"]
DELIVERY_COLUMNS = [
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
    "last_status_code",
    "last_error",
]


# --- results -------------------------------------------------------------------------------------


@dataclass
class Plan:
    """One EXPLAIN (ANALYZE, BUFFERS): the plan's nodes, top down, and its times."""

    nodes: list[str]
    indexes: list[str]
    execution_ms: float
    planning_ms: float
    rows: int
    shared_hit: int
    shared_read: int

    @property
    def uses_due_index(self) -> bool:
        return DUE_INDEX in self.indexes

    def as_text(self) -> str:
        return (
            f"{' > '.join(self.nodes)}; {self.rows} rows, execution {self.execution_ms:.3f} ms "
            f"(planning {self.planning_ms:.3f} ms), buffers hit {self.shared_hit} "
            f"read {self.shared_read}"
        )


@dataclass
class SizeResult:
    backlog: int
    due: int
    load_s: float
    table_mb: dict[str, float]
    sweep_idle_ms: list[float]
    due_query_idle_ms: list[float]
    unrouted_query_ms: list[float]
    sweep_due_no_jobs_ms: list[float]
    sweep_due_jobs_queued_ms: list[float]
    due_query_due_ms: list[float]
    deliver_s: float
    deliver_cpu: dict[str, float]  # cores busy during (c): this process, the whole machine
    attempt_ms: list[float] = field(repr=False)
    plans: dict[str, Plan]
    statuses: dict[str, int]
    sink_distinct: int
    problems: list[str]

    @property
    def deliveries_per_s(self) -> float:
        return self.due / self.deliver_s if self.deliver_s > 0 else math.nan

    def figures(self) -> dict[str, float]:
        """The figures of the table (medians of the repeats), by key."""
        return {
            "sweep_idle_ms": median(self.sweep_idle_ms),
            "unrouted_query_ms": median(self.unrouted_query_ms),
            "due_query_idle_ms": median(self.due_query_idle_ms),
            "sweep_due_no_jobs_ms": median(self.sweep_due_no_jobs_ms),
            "sweep_due_jobs_queued_ms": median(self.sweep_due_jobs_queued_ms),
            "due_query_due_ms": median(self.due_query_due_ms),
            "deliveries_per_s": self.deliveries_per_s,
            "attempt_p50_ms": percentile(self.attempt_ms, 0.50),
            "attempt_p99_ms": percentile(self.attempt_ms, 0.99),
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "backlog": self.backlog,
            "due": self.due,
            **{key: _round(value) for key, value in self.figures().items()},
            "load_s": round(self.load_s, 2),
            "table_mb": self.table_mb,
            "samples_ms": {
                "sweep_idle": _rounded(self.sweep_idle_ms),
                "unrouted_query": _rounded(self.unrouted_query_ms),
                "due_query_idle": _rounded(self.due_query_idle_ms),
                "sweep_due_no_jobs": _rounded(self.sweep_due_no_jobs_ms),
                "sweep_due_jobs_queued": _rounded(self.sweep_due_jobs_queued_ms),
                "due_query_due": _rounded(self.due_query_due_ms),
            },
            "deliver_s": round(self.deliver_s, 3),
            "deliver_cpu_cores": self.deliver_cpu,
            "explain": {
                name: {**asdict(plan), "uses_ix_deliveries_due": plan.uses_due_index}
                for name, plan in self.plans.items()
            },
            "delivery_statuses": self.statuses,
            "sink_distinct": self.sink_distinct,
            "problems": self.problems,
        }


ROWS = (
    ("sweep_idle_ms", "(a) sweep, nothing due", "ms"),
    ("unrouted_query_ms", "    its unrouted-events query alone", "ms"),
    ("due_query_idle_ms", "    its due-deliveries query alone", "ms"),
    ("sweep_due_no_jobs_ms", "(b) sweep, {due} due without a job", "ms"),
    ("sweep_due_jobs_queued_ms", "    sweep, {due} due with jobs queued", "ms"),
    ("due_query_due_ms", "    due-deliveries query alone ({due} due)", "ms"),
    ("deliveries_per_s", "(c) claim + attempt + record", "/s"),
    ("attempt_p50_ms", "    one attempt, p50", "ms"),
    ("attempt_p99_ms", "    one attempt, p99", "ms"),
)
PLAN_LABELS = {
    "due_query_idle": "due-deliveries query, nothing due",
    "due_query_due": "due-deliveries query, {due} due",
    "unrouted_query": "unrouted-events query",
}


@dataclass
class Report:
    args: argparse.Namespace
    sizes: list[SizeResult]
    duration_s: float

    @property
    def problems(self) -> list[str]:
        return [f"B={size.backlog}: {problem}" for size in self.sizes for problem in size.problems]

    def growth(self) -> dict[str, float]:
        first, last = self.sizes[0].figures(), self.sizes[-1].figures()
        return {key: last[key] / first[key] if first[key] else math.nan for key in first}

    def as_json(self) -> dict[str, Any]:
        growth = self.growth() if len(self.sizes) > 1 else {}
        return {
            "sizes": [size.as_json() for size in self.sizes],
            "growth": {key: _round(value, 3) for key, value in growth.items()},
            "growth_of": [self.sizes[0].backlog, self.sizes[-1].backlog],
            "repeat": self.args.repeat,
            "concurrency": self.args.concurrency,
            "due": self.args.due,
            "duration_s": round(self.duration_s, 1),
            "problems": self.problems,
        }

    def as_text(self) -> str:
        due = self.args.due
        growth = self.growth() if len(self.sizes) > 1 else {}
        width = 44
        head = f"{'backlog B (pending, not due)':<{width}}" + "".join(
            f"{size.backlog:>12,}" for size in self.sizes
        )
        if growth:
            head += f"{'growth':>10}"
        lines = [
            f"backlog benchmark: medians of {self.args.repeat} runs per sweep figure, "
            f"{due} due deliveries, concurrency {self.args.concurrency} for (c); "
            f"{self.duration_s:.0f} s in all",
            "",
            head,
        ]
        for key, label, unit in ROWS:
            cells = "".join(f"{size.figures()[key]:>10.1f}{unit:<2}" for size in self.sizes)
            line = f"{label.format(due=due):<{width}}{cells}"
            if growth:
                line += f"{growth[key]:>9.2f}x"
            lines.append(line)
        lines.append(
            f"{'tables (deliveries / received_events), MB':<{width}}"
            + "".join(
                f"{size.table_mb['deliveries']:>6.1f}/{size.table_mb['received_events']:<5.1f}"
                for size in self.sizes
            )
        )
        lines.append(
            f"{'bulk load (COPY + VACUUM ANALYZE), s':<{width}}"
            + "".join(f"{size.load_s:>10.1f}s " for size in self.sizes)
        )
        lines.append("")
        lines.append("EXPLAIN (ANALYZE, BUFFERS):")
        for name, label in PLAN_LABELS.items():
            for size in self.sizes:
                plan = size.plans[name]
                used = (
                    f"; {DUE_INDEX} {'used' if plan.uses_due_index else 'NOT used'}"
                    if name.startswith("due")
                    else ""
                )
                lines.append(f"  B={size.backlog:,}, {label.format(due=due)}{used}:")
                lines.append(f"    {plan.as_text()}")
        for size in self.sizes:
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(size.statuses.items()))
            lines.append(
                f"B={size.backlog:,}: deliveries in SQL after (c): {statuses}; "
                f"sink saw {size.sink_distinct} distinct ids; cores busy during (c): this "
                f"process {size.deliver_cpu['bench']:g}, machine {size.deliver_cpu['machine']:g}"
            )
        problems = self.problems
        lines.append("result: " + ("FAILED: " + "; ".join(problems) if problems else "ok"))
        return "\n".join(lines)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return math.nan
    return sorted(values)[max(1, math.ceil(fraction * len(values))) - 1]


def _round(value: float, digits: int = 2) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def _rounded(values: Sequence[float]) -> list[float]:
    return [round(value, 2) for value in values]


# --- the data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    kind: str
    payload: str  # JSON text, as the json column takes it
    raw: bytes
    policy: str


def body_pool(seed: int) -> list[Body]:
    """Realistic callback bodies of the benchmark mix, with their kinds and platform policy."""
    pool = []
    for item in build_events(BODY_POOL, seed):
        kind = KIND_BY_PATH[item.path]
        payload = json.loads(item.body)
        policy = Router.policy_name(PLATFORM_POLICY, kind, payload)
        pool.append(Body(kind, item.body.decode(), item.body, policy))
    return pool


def rows_for(
    count: int, offset: int, bodies: Sequence[Body], now: datetime, rng: random.Random, *, due: bool
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(received_events, routed_events, deliveries) rows: ``due`` ones are due now, never
    attempted; the others were received up to an hour ago, failed 1-5 times and wait 10 min to
    10 h for their next attempt."""
    events, routed, deliveries = [], [], []
    for number in range(offset, offset + count):
        body = bodies[number % len(bodies)]
        if due:
            received = now - timedelta(seconds=rng.uniform(5, 60))
        else:
            received = now - timedelta(seconds=rng.uniform(60, 3600))
        event_id = new_id(received)
        events.append(
            (
                event_id,
                SOURCE,
                body.kind,
                f"bench:{number}",
                received,
                body.payload,
                body.raw,
                "application/json",
                "POST",
                HOST,
                0,
            )
        )
        routed.append((event_id, received, 1))
        if due:
            attempts, first, last, next_at, code, error = 0, None, None, received, None, None
        else:
            attempts = rng.randint(1, 5)
            first = received + timedelta(seconds=1)
            last = first + timedelta(seconds=rng.uniform(0, 50))
            next_at = now + timedelta(seconds=rng.uniform(600, 36_000))
            code, error = 503, "HTTP 503"
        deliveries.append(
            (
                new_id(received),
                event_id,
                DESTINATION,
                body.policy,
                "pending",
                attempts,
                0,
                received,
                first,
                last,
                next_at,
                code,
                error,
            )
        )
    return events, routed, deliveries


async def copy_rows(
    dsn: str,
    rows: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]],
    *,
    vacuum: bool,
) -> None:
    events, routed, deliveries = rows
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        async with conn.transaction():
            await conn.copy_records_to_table(
                "received_events", records=events, columns=EVENT_COLUMNS
            )
            await conn.copy_records_to_table(
                "routed_events", records=routed, columns=ROUTED_COLUMNS
            )
            await conn.copy_records_to_table(
                "deliveries", records=deliveries, columns=DELIVERY_COLUMNS
            )
        if vacuum:
            await conn.execute("VACUUM ANALYZE received_events, routed_events, deliveries")
    finally:
        await conn.close()


async def table_mb(dsn: str) -> dict[str, float]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        sizes = {}
        for table in ("deliveries", "received_events", "routed_events"):
            size = await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", table)
            sizes[table] = round(size / 2**20, 1)
        return sizes
    finally:
        await conn.close()


# --- measuring -----------------------------------------------------------------------------------


async def timed_ms(call: Callable[[], Awaitable[T]]) -> tuple[float, T]:
    started = time.perf_counter()
    result = await call()
    return (time.perf_counter() - started) * 1000, result


@contextlib.contextmanager
def captured_sql(engine: AsyncEngine) -> Iterator[list[tuple[str, Any]]]:
    """The statements (and their DBAPI parameters) the engine sends meanwhile."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine.sync_engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", capture)


async def explain(engine: AsyncEngine, call: Callable[[], Awaitable[Any]]) -> Plan:
    """EXPLAIN (ANALYZE, BUFFERS) of the one query ``call`` sends, with its own parameters."""
    with captured_sql(engine) as seen:
        await call()
    queries = [(sql, params) for sql, params in seen if re.search(r"\bFROM\b", sql, re.I)]
    if not queries:
        raise BenchError(f"no query to explain among {len(seen)} statements")
    sql, params = queries[-1]
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
        )
        document = result.scalar_one()
    if isinstance(document, str):
        document = json.loads(document)
    top = document[0]
    nodes: list[str] = []
    indexes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        name = node["Node Type"]
        if node.get("Index Name"):
            indexes.append(node["Index Name"])
            name += f" using {node['Index Name']}"
        elif node.get("Relation Name"):
            name += f" on {node['Relation Name']}"
        if node.get("Join Type"):
            name += f" ({node['Join Type']})"
        nodes.append(name)
        for child in node.get("Plans", []):
            walk(child)

    walk(top["Plan"])
    return Plan(
        nodes=nodes,
        indexes=indexes,
        execution_ms=float(top.get("Execution Time", math.nan)),
        planning_ms=float(top.get("Planning Time", math.nan)),
        rows=int(top["Plan"].get("Actual Rows", 0)),
        shared_hit=int(top["Plan"].get("Shared Hit Blocks", 0)),
        shared_read=int(top["Plan"].get("Shared Read Blocks", 0)),
    )


async def deliver_all(
    services: WorkerServices, ids: Sequence[str], concurrency: int
) -> tuple[float, list[float], int]:
    """Every delivery attempted by the worker's Deliverer, ``concurrency`` at once: (seconds,
    per-attempt milliseconds, how many asked for a next job)."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    follow_ups = 0

    async def one(delivery_id: str) -> None:
        nonlocal follow_ups
        async with gate:
            took, next_due = await timed_ms(lambda: services.deliverer.attempt(delivery_id))
            latencies.append(took)
            follow_ups += next_due is not None

    started = time.perf_counter()
    await asyncio.gather(*(one(delivery_id) for delivery_id in ids))
    return time.perf_counter() - started, sorted(latencies), follow_ups


# --- one backlog size ----------------------------------------------------------------------------


def write_config(workdir: Path, database_url: str, redis_url: str, sink_url: str) -> Path:
    config = workdir / "relay.toml"
    config.write_text(
        f'database_url = "{database_url}"\n'
        f'redis_url = "{redis_url}"\n'
        "\n"
        f'[sources.{SOURCE}]\ntoken = "{secrets.token_urlsafe(24)}"\n'
        "\n"
        f"[destinations.{DESTINATION}]\n"
        'type = "http"\n'
        f'url = "{sink_url}"\n'
        'format = "envelope"\n'
        'timeout = "5s"\n',
        encoding="utf-8",
    )
    return config


CREATED_DATABASES: list[str] = []
"""Databases created and not dropped yet (``run`` drops what is left on the way out)."""


@contextlib.asynccontextmanager
async def fresh_database(
    admin_dsn: str, workdir: Path, config_for: Callable[[str], Path]
) -> AsyncIterator[tuple[str, Path]]:
    """A new database, migrated with `relay db upgrade`; dropped on the way out."""
    database = f"backlog_{secrets.token_hex(6)}"
    base = admin_dsn.rsplit("/", 1)[0]
    dsn = f"{base}/{database}"
    try:
        await admin_execute(admin_dsn, f'CREATE DATABASE "{database}"')
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise BenchError(f"PostgreSQL at {admin_dsn} is not usable: {exc}") from None
    CREATED_DATABASES.append(database)
    try:
        print(f"database {database}", file=sys.stderr, flush=True)
        config = config_for(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
        upgrade = await asyncio.to_thread(
            subprocess.run,
            [*relay_command(), "db", "upgrade", "--config", str(config)],
            cwd=workdir,
            env=relay_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if upgrade.returncode != 0:
            raise BenchError(f"relay db upgrade failed:\n{upgrade.stdout}{upgrade.stderr}")
        yield dsn, config
    finally:
        await asyncio.shield(drop_database(admin_dsn, database))


async def drop_database(admin_dsn: str, database: str) -> None:
    try:
        await admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        print(f"warning: could not drop database {database}: {exc}", file=sys.stderr)
    else:
        with contextlib.suppress(ValueError):
            CREATED_DATABASES.remove(database)


def note(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')}  {text}", file=sys.stderr, flush=True)


async def measure_size(
    args: argparse.Namespace,
    backlog: int,
    bodies: Sequence[Body],
    workdir: Path,
    sink: SinkControl,
) -> SizeResult:
    rng = random.Random(args.seed + backlog)
    problems: list[str] = []

    def config_for(database_url: str) -> Path:
        return write_config(workdir, database_url, args.redis_url, sink.url)

    async with fresh_database(args.pg_admin_dsn, workdir, config_for) as (dsn, config):
        began = time.perf_counter()
        await copy_rows(dsn, rows_for(backlog, 0, bodies, utc_now(), rng, due=False), vacuum=True)
        load_s = time.perf_counter() - began
        note(f"B={backlog:,}: backlog written in {load_s:.1f} s")
        settings = load_settings(config)
        engine = create_engine(settings.database_url)
        pool = await create_pool(RedisSettings.from_dsn(args.redis_url))
        services = worker_services(settings, engine, pool, utc_now)
        try:
            sweep, now = services.sweeper.sweep, utc_now

            async def due_query() -> list[outbox.Due]:
                return await outbox.due_deliveries(engine, now(), BATCH)

            async def unrouted_query() -> list[outbox.EventRef]:
                return await outbox.unrouted_events(engine, now() - ROUTE_GRACE, BATCH)

            await sweep()  # warm up: connections, statement caches
            sweep_idle, due_idle, unrouted = [], [], []
            for _ in range(args.repeat):
                took, report = await timed_ms(sweep)
                sweep_idle.append(took)
                if report.enqueued_jobs or report.routed_events:
                    problems.append(f"an idle sweep did something: {report}")
                due_idle.append((await timed_ms(due_query))[0])
                unrouted.append((await timed_ms(unrouted_query))[0])
            plans = {
                "due_query_idle": await explain(engine, due_query),
                "unrouted_query": await explain(engine, unrouted_query),
            }

            due_rows = rows_for(args.due, backlog, bodies, utc_now(), rng, due=True)
            await copy_rows(dsn, due_rows, vacuum=False)
            due_ids = [row[0] for row in due_rows[2]]
            sweep_due, sweep_queued, due_due = [], [], []
            for _ in range(args.repeat):
                await pool.flushdb()  # the jobs are gone: every due delivery needs one
                took, report = await timed_ms(sweep)
                sweep_due.append(took)
                if report.enqueued_jobs != args.due:
                    problems.append(f"a sweep enqueued {report.enqueued_jobs} of {args.due} jobs")
                took, report = await timed_ms(sweep)
                sweep_queued.append(took)
                if report.enqueued_jobs:
                    problems.append(f"a sweep re-enqueued {report.enqueued_jobs} queued jobs")
                due_due.append((await timed_ms(due_query))[0])
            plans["due_query_due"] = await explain(engine, due_query)
            queued = await pool.zcard(QUEUE_NAME)
            if queued != args.due:
                problems.append(f"{queued} jobs queued for {args.due} due deliveries")
            await pool.flushdb()
            note(f"B={backlog:,}: sweeps measured; attempting {args.due} due deliveries")

            await sink.reset()
            cpu_before = time.process_time(), machine_cpu()[0]
            deliver_s, attempt_ms, follow_ups = await deliver_all(
                services, due_ids, args.concurrency
            )
            if follow_ups:
                problems.append(f"{follow_ups} attempts asked for a next job (not succeeded)")
            statuses = await outbox.delivery_counts(engine)
            succeeded = await succeeded_among(dsn, due_ids)
            if succeeded != len(due_ids):
                problems.append(f"{succeeded} of {len(due_ids)} due deliveries succeeded")
            deliver_cpu = {
                "bench": round((time.process_time() - cpu_before[0]) / deliver_s, 2),
                "machine": round((machine_cpu()[0] - cpu_before[1]) / deliver_s, 2),
            }
            sink_distinct = await sink.distinct()
            if sink_distinct != len(due_ids):
                problems.append(f"the sink saw {sink_distinct} of {len(due_ids)} deliveries")
            sizes = await table_mb(dsn)
        finally:
            await services.aclose()
            await pool.flushdb()
            await pool.aclose()
            await engine.dispose()
    note(f"B={backlog:,}: {args.due / deliver_s:.0f} deliveries/s")
    return SizeResult(
        backlog=backlog,
        due=args.due,
        load_s=load_s,
        table_mb=sizes,
        sweep_idle_ms=sweep_idle,
        due_query_idle_ms=due_idle,
        unrouted_query_ms=unrouted,
        sweep_due_no_jobs_ms=sweep_due,
        sweep_due_jobs_queued_ms=sweep_queued,
        due_query_due_ms=due_due,
        deliver_s=deliver_s,
        deliver_cpu=deliver_cpu,
        attempt_ms=attempt_ms,
        plans=plans,
        statuses=statuses,
        sink_distinct=sink_distinct,
        problems=problems,
    )


async def succeeded_among(dsn: str, ids: Sequence[str]) -> int:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM deliveries WHERE id = ANY($1::text[]) AND status = 'succeeded'",
            list(ids),
        )
        return int(count)
    finally:
        await conn.close()


# --- the sink and the whole run ------------------------------------------------------------------


class SinkControl:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.base = f"http://{HOST}:{server.port}"
        self.url = self.base + SINK_PATH
        self.client = httpx.AsyncClient(timeout=30, trust_env=False)

    async def reset(self) -> None:
        (await self.client.post(self.base + "/_bench/reset")).raise_for_status()

    async def distinct(self) -> int:
        answer = await self.client.get(self.base + "/_bench/count")
        answer.raise_for_status()
        return int(answer.json()["distinct"])

    async def aclose(self) -> None:
        await self.client.aclose()


async def check_redis(url: str) -> None:
    pool = await create_pool(RedisSettings.from_dsn(url))
    try:
        keys = await pool.dbsize()
    finally:
        await pool.aclose()
    if keys:
        raise BenchError(
            f"the Redis database {url} holds {keys} keys; it is flushed by this benchmark, "
            "so pick an empty one (--redis-url)"
        )


async def run_async(args: argparse.Namespace, workdir: Path, servers: list[Server]) -> Report:
    started = time.monotonic()
    try:
        await check_redis(args.redis_url)
    except OSError as exc:
        raise BenchError(f"Redis at {args.redis_url} is not usable: {exc}") from None
    bodies = await asyncio.to_thread(body_pool, args.seed)
    port = free_port()
    server = start_server("sink", uvicorn_argv("sink_app:app", port), port, workdir, relay_env())
    servers.append(server)
    await wait_ready(server, "/_bench/healthz")
    sink = SinkControl(server)
    try:
        sizes = []
        for backlog in args.sizes:
            sizes.append(await measure_size(args, backlog, bodies, workdir, sink))
    finally:
        await sink.aclose()
    return Report(args, sizes, time.monotonic() - started)


def flush_redis(url: str) -> None:
    async def flush() -> None:
        pool = await create_pool(RedisSettings.from_dsn(url))
        try:
            await pool.flushdb()
        finally:
            await pool.aclose()

    try:
        asyncio.run(flush())
    except Exception as exc:  # a warning, the run's outcome stands
        print(f"warning: could not flush {url}: {exc}", file=sys.stderr)


def run(args: argparse.Namespace, workdir: Path) -> Report:
    servers: list[Server] = []

    async def bounded() -> Report:
        try:
            async with asyncio.timeout(args.timeout):
                return await run_async(args, workdir, servers)
        except TimeoutError:
            raise BenchError("the run took longer than --timeout") from None

    with sigterm_interrupts():
        try:
            with asyncio.Runner() as runner:
                return runner.run(bounded())
        finally:
            for server in servers:
                stop_server(server)
            for database in list(CREATED_DATABASES):  # only when the run was cut short
                asyncio.run(drop_database(args.pg_admin_dsn, database))
            flush_redis(args.redis_url)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of integers") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("at least one size, each at least 1")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=[10_000, 100_000],
        help="backlog sizes B, comma-separated (default 10000,100000)",
    )
    parser.add_argument(
        "--due", type=at_least(1), default=1000, help="due deliveries for (b) and (c)"
    )
    parser.add_argument(
        "--concurrency", type=at_least(1), default=50, help="attempts at once in (c)"
    )
    parser.add_argument("--repeat", type=at_least(1), default=5, help="runs per sweep figure")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seed", type=int, default=20260301, help="data generator seed")
    parser.add_argument("--timeout", type=float, default=900.0, help="overall limit, seconds")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("RELAY_BACKLOG_REDIS_URL", DEFAULT_REDIS_URL),
        help="the Redis database the sweeper enqueues on (must be empty; flushed at the end)",
    )
    parser.add_argument(
        "--pg-admin-dsn",
        default=os.environ.get("RELAY_TEST_PG_DSN", DEFAULT_PG_ADMIN_DSN),
        help="where to CREATE and DROP the run's databases",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        require_local(args.pg_admin_dsn, "PostgreSQL")
        require_local(args.redis_url, "Redis")
    except BenchError as exc:
        print(f"bench_backlog: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="backlog-") as tmp:
        try:
            report = run(args, Path(tmp))
        except BenchError as exc:
            print(f"bench_backlog: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("bench_backlog: interrupted", file=sys.stderr)
            return 130
        except Exception:
            traceback.print_exc()
            print("bench_backlog: the run failed", file=sys.stderr)
            return 2
    print(json.dumps(report.as_json()) if args.json else report.as_text())
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
