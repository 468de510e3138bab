"""Backlog benchmark: how the relay's SQL work grows when 10x more deliveries are pending.

For each backlog size B (``--sizes``, default 10,000 and 100,000), on a fresh PostgreSQL database
(``--pg-admin-dsn``; `relay db upgrade`; dropped at the end):

1. B pending deliveries that are NOT due (next attempt 10 min to 10 h ahead, 1-5 failed
   attempts), with their ``received_events`` (the harness's mix of bodies) and ``routed_events``
   rows, written with COPY into those documented tables, then ``VACUUM ANALYZE``;
2. (a) one sweep with nothing due, ``--repeat`` times (median), and its two queries alone;
3. ``--due`` (1,000) deliveries due now are added; (b) one sweep when they have no job (the
   Redis database ``--redis-url`` flushed before each repeat) and one when their jobs are queued;
4. EXPLAIN (ANALYZE, BUFFERS) of the due-deliveries query as the relay sends it (captured from
   its engine), with nothing and with ``--due`` due, and of the unrouted-events query;
5. (c) the due deliveries claimed, attempted (POST to the harness's sink) and recorded,
   ``--concurrency`` at once: deliveries/s and p50/p99 per attempt; the sink must have them all
   and the store must say succeeded (`relay deliveries list`).

What is timed is the worker's own sweeper, queries and deliverer, called in this process: no
command or endpoint times one sweep or one attempt, so this script uses the package's
internals for exactly that (the ``relay``/``receivers`` imports below) and public entry points
for the rest. ``--json`` prints one object; exit status 1 when a check failed (a sweep enqueued
the wrong number of jobs, a delivery not succeeded or not at the sink), 2 when the run failed::

    python scripts/bench_backlog.py [--sizes 10000,100000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import asyncpg
import harness
from arq.connections import RedisSettings, create_pool
from harness import HOST, BenchError, Stack, at_least, percentile
from sqlalchemy import event as sa_event

# The timed internals (see the docstring): the worker's services, its queries and its queue.
from receivers.store import create_engine, new_id, utc_now
from relay import outbox
from relay.dispatch.jobs import QUEUE_NAME, JobQueue
from relay.outbox.router import PLATFORM_POLICY, Router
from relay.outbox.sweeper import BATCH, ROUTE_GRACE
from relay.server.services import worker_services
from relay.settings import load_settings

EVENT_COLUMNS = ["id", "source", "kind", "dedup_key", "received_at", "payload", "raw_body",
                 "content_type", "method", "remote_addr", "duplicates"]  # fmt: skip
DELIVERY_COLUMNS = ["id", "event_id", "destination", "policy", "status", "attempts",
                    "schedule_base", "created_at", "first_attempt_at", "last_attempt_at",
                    "next_attempt_at", "last_status_code", "last_error"]  # fmt: skip
ROUTED_COLUMNS = ["event_id", "routed_at", "deliveries"]
FIGURES = (  # key, label, unit
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


class Body(NamedTuple):
    kind: str
    raw: bytes
    policy: str

    @property
    def payload(self) -> str:
        return self.raw.decode()


def body_pool(seed: int) -> list[Body]:
    """5,000 bodies of the harness's mix, each with its kind and its platform retry policy."""
    return [Body(kind := harness.KINDS[e.path], e.body,
                 Router.policy_name(PLATFORM_POLICY, kind, json.loads(e.body)))
            for e in harness.build_events(5000, seed)]  # fmt: skip


def rows_for(count: int, offset: int, pool: Sequence[Body],
             rng: random.Random, *, due: bool) -> tuple[list, list, list]:  # fmt: skip
    """(received_events, routed_events, deliveries) rows: ``due`` ones due now and never
    attempted; the others received up to an hour ago, failed 1-5 times, due in 10 min - 10 h."""
    events, routed, deliveries, now = [], [], [], utc_now()
    for number in range(offset, offset + count):
        kind, raw, policy = pool[number % len(pool)]
        received = now - timedelta(seconds=rng.uniform(5, 60) if due else rng.uniform(60, 3600))
        event_id = new_id(received)
        events.append((event_id, "default", kind, f"bench:{number}", received, raw.decode(), raw,
                       "application/json", "POST", HOST, 0))  # fmt: skip
        routed.append((event_id, received, 1))
        tried = (0, None, None, received, None, None) if due else (
            rng.randint(1, 5), received + timedelta(seconds=1),
            received + timedelta(seconds=rng.uniform(1, 50)),
            now + timedelta(seconds=rng.uniform(600, 36_000)), 503, "HTTP 503")  # fmt: skip
        deliveries.append((new_id(received), event_id, "sink", policy, "pending", tried[0], 0,
                           received, *tried[1:]))  # fmt: skip
    return events, routed, deliveries


async def copy_rows(dsn: str, rows: tuple[list, list, list], vacuum: bool) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        async with conn.transaction():
            for table, records, columns in zip(
                ("received_events", "routed_events", "deliveries"), rows,
                (EVENT_COLUMNS, ROUTED_COLUMNS, DELIVERY_COLUMNS),
                strict=True,
            ):  # fmt: skip
                await conn.copy_records_to_table(table, records=records, columns=columns)
        if vacuum:
            await conn.execute("VACUUM ANALYZE received_events, routed_events, deliveries")
    finally:
        await conn.close()


async def timed_ms(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await call()
    return (time.perf_counter() - started) * 1000, result


async def explain(engine: Any, call: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the query ``call`` sends, with its own parameters."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    sa_event.listen(engine.sync_engine, "before_cursor_execute", capture)
    try:
        await call()
    finally:
        sa_event.remove(engine.sync_engine, "before_cursor_execute", capture)
    sql, params = [q for q in seen if re.search(r"\bFROM\b", q[0], re.I)][-1]
    async with engine.connect() as conn:
        result = await conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params
        )
        document = result.scalar_one()
    top = (json.loads(document) if isinstance(document, str) else document)[0]
    nodes, indexes, todo = [], [], [top["Plan"]]
    while todo:
        node = todo.pop(0)
        indexes += [node["Index Name"]] if node.get("Index Name") else []
        where = node.get("Index Name") or node.get("Relation Name")
        nodes.append(node["Node Type"] + (f" on {where}" if where else ""))
        todo = node.get("Plans", []) + todo
    return {"nodes": nodes, "indexes": indexes, "execution_ms": top.get("Execution Time"),
            "rows": top["Plan"].get("Actual Rows"),
            "shared_hit": top["Plan"].get("Shared Hit Blocks"),
            "shared_read": top["Plan"].get("Shared Read Blocks")}  # fmt: skip


async def measure(args: argparse.Namespace, stack: Stack, backlog: int, pool: list, sink: int):
    rng, problems = random.Random(args.seed + backlog), []
    dsn = stack.postgres_database(args.pg_admin_dsn, "backlog")
    config = harness.write_settings(stack.workdir / f"relay-{backlog}.toml",
        {"database_url": dsn, "redis_url": args.redis_url},
        ("sources.default", {"token": secrets.token_urlsafe(24)}),
        ("destinations.sink", {"type": "http", "url": f"http://{HOST}:{sink}/relay",
                               "format": "envelope", "timeout": "5s"}))  # fmt: skip
    harness.relay(config, "db", "upgrade")
    began = time.perf_counter()
    await copy_rows(dsn, rows_for(backlog, 0, pool, rng, due=False), vacuum=True)
    load_s = time.perf_counter() - began
    harness.log(f"B={backlog:,}: backlog written in {load_s:.1f} s")
    settings = load_settings(config)
    engine = create_engine(settings.database_url)
    queue = await create_pool(RedisSettings.from_dsn(args.redis_url))
    services = worker_services(settings, engine, JobQueue(queue), utc_now)
    figures: dict[str, list[float]] = {key: [] for key, _, _ in FIGURES[:6]}
    try:
        sweep = services.sweeper.sweep

        async def due_query() -> Any:
            return await outbox.due_deliveries(engine, utc_now(), BATCH)

        async def unrouted_query() -> Any:
            return await outbox.unrouted_events(engine, utc_now() - ROUTE_GRACE, BATCH)

        await sweep()  # warm up: connections, statement caches
        for _ in range(args.repeat):
            took, report = await timed_ms(sweep)
            figures["sweep_idle_ms"].append(took)
            if report.enqueued_jobs or report.routed_events:
                problems.append(f"an idle sweep did something: {report}")
            figures["due_query_idle_ms"].append((await timed_ms(due_query))[0])
            figures["unrouted_query_ms"].append((await timed_ms(unrouted_query))[0])
        plans = {"due_query_idle": await explain(engine, due_query),
                 "unrouted_query": await explain(engine, unrouted_query)}  # fmt: skip
        due_rows = rows_for(args.due, backlog, pool, rng, due=True)
        await copy_rows(dsn, due_rows, vacuum=False)
        for _ in range(args.repeat):
            await queue.flushdb()  # the jobs are gone: every due delivery needs one
            took, report = await timed_ms(sweep)
            figures["sweep_due_no_jobs_ms"].append(took)
            if report.enqueued_jobs != args.due:
                problems.append(f"a sweep enqueued {report.enqueued_jobs} of {args.due} jobs")
            took, report = await timed_ms(sweep)
            figures["sweep_due_jobs_queued_ms"].append(took)
            if report.enqueued_jobs:
                problems.append(f"a sweep re-enqueued {report.enqueued_jobs} queued jobs")
            figures["due_query_due_ms"].append((await timed_ms(due_query))[0])
        plans["due_query_due"] = await explain(engine, due_query)
        if (queued := await queue.zcard(QUEUE_NAME)) != args.due:
            problems.append(f"{queued} jobs queued for {args.due} due deliveries")
        await queue.flushdb()
        harness.sink_call(sink, "/_sink/reset", "POST")
        gate, attempt_ms = asyncio.Semaphore(args.concurrency), []
        cpu = time.process_time(), harness.machine_cpu()[0]

        async def attempt(delivery_id: str) -> None:
            async with gate:
                took, next_due = await timed_ms(lambda: services.deliverer.attempt(delivery_id))
                attempt_ms.append(took)
                if next_due is not None:
                    problems.append(f"delivery {delivery_id} asked for a next job")

        deliver_s, _ = await timed_ms(
            lambda: asyncio.gather(*map(attempt, [r[0] for r in due_rows[2]]))
        )
        deliver_s /= 1000
        cores = {"bench": (time.process_time() - cpu[0]) / deliver_s,
                 "machine": (harness.machine_cpu()[0] - cpu[1]) / deliver_s}  # fmt: skip
        cores = {k: round(v, 2) for k, v in cores.items()}
    finally:
        await services.aclose()
        await queue.flushdb()
        await queue.aclose()
        await engine.dispose()
    statuses = harness.delivery_statuses(config)
    if statuses.get("succeeded", 0) != args.due:
        problems.append(f"{statuses.get('succeeded', 0)} of {args.due} due deliveries succeeded")
    seen = harness.sink_call(sink, "/_sink/count")["distinct"]
    if seen != args.due:
        problems.append(f"the sink saw {seen} of {args.due} deliveries")
    harness.log(f"B={backlog:,}: {args.due / deliver_s:.0f} deliveries/s")
    medians = {key: statistics.median(values) for key, values in figures.items()}
    return {"backlog": backlog, "due": args.due, "load_s": load_s, **medians,
            "deliveries_per_s": args.due / deliver_s,
            "attempt_p50_ms": percentile(attempt_ms, 0.5),
            "attempt_p99_ms": percentile(attempt_ms, 0.99), "deliver_cpu_cores": cores,
            "samples_ms": figures, "explain": plans, "delivery_statuses": statuses,
            "sink_distinct": seen, "problems": problems}  # fmt: skip


class Report:
    def __init__(self, args: argparse.Namespace, sizes: list[dict[str, Any]], seconds: float):
        self.args, self.sizes, self.seconds = args, sizes, seconds
        first, last = sizes[0], sizes[-1]
        self.growth = {key: last[key] / first[key] if first[key] else math.nan
                       for key, _, _ in FIGURES} if len(sizes) > 1 else {}  # fmt: skip
        self.problems = [f"B={s['backlog']}: {p}" for s in sizes for p in s["problems"]]

    def as_json(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "growth": self.growth, "repeat": self.args.repeat,
                "concurrency": self.args.concurrency, "due": self.args.due,
                "duration_s": round(self.seconds, 1), "problems": self.problems}  # fmt: skip

    def as_text(self) -> str:
        due, width = self.args.due, 44
        head = f"{'backlog B (pending, not due)':<{width}}"
        lines = [
            f"backlog benchmark: medians of {self.args.repeat} runs, {due} due, concurrency "
            f"{self.args.concurrency} for (c); {self.seconds:.0f} s in all",
            head + "".join(f"{s['backlog']:>12,}" for s in self.sizes)
            + (f"{'growth':>10}" if self.growth else ""),
        ]  # fmt: skip
        for key, label, unit in FIGURES:
            cells = "".join(f"{s[key]:>10.1f}{unit:<2}" for s in self.sizes)
            grown = f"{self.growth[key]:>9.2f}x" if self.growth else ""
            lines.append(f"{label.format(due=due):<{width}}{cells}{grown}")
        lines.append("EXPLAIN (ANALYZE, BUFFERS):")
        for s in self.sizes:
            for name, plan in s["explain"].items():
                used = "ix_deliveries_due" in plan["indexes"]
                index = f"; ix_deliveries_due {'used' if used else 'NOT used'}" * (
                    name[:3] == "due"
                )
                nodes = " > ".join(plan["nodes"])
                lines.append(f"  B={s['backlog']:,} {name}: {nodes}; {plan['rows']} rows, "
                             f"{plan['execution_ms']:.3f} ms{index}")  # fmt: skip
        for s in self.sizes:
            lines.append(f"B={s['backlog']:,}: deliveries after (c) {s['delivery_statuses']}, sink "
                         f"saw {s['sink_distinct']}, load {s['load_s']:.1f} s, cores busy during "
                         f"(c) {s['deliver_cpu_cores']}")  # fmt: skip
        lines.append(
            "result: " + ("FAILED: " + "; ".join(self.problems) if self.problems else "ok")
        )
        return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> Report:
    started = time.monotonic()
    if keys := harness.flush_redis(args.redis_url, only_count=True):
        raise BenchError(f"{args.redis_url} holds {keys} keys; it is flushed: pick an empty one")
    pool = body_pool(args.seed)
    with Stack("backlog") as stack:
        stack.undo(lambda: harness.flush_redis(args.redis_url))
        _, sink = stack.start_sink()

        async def sizes() -> list[dict[str, Any]]:
            async with asyncio.timeout(args.timeout):
                return [await measure(args, stack, b, pool, sink) for b in args.sizes]

        try:
            measured = asyncio.run(sizes())
        except TimeoutError:
            raise BenchError("the run took longer than --timeout") from None
    return Report(args, measured, time.monotonic() - started)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--sizes", default="10000,100000", help="backlog sizes B, comma-separated")
    add("--due", type=at_least(1), default=1000, help="due deliveries for (b) and (c)")
    add("--concurrency", type=at_least(1), default=50, help="attempts at once in (c)")
    add("--repeat", type=at_least(1), default=5, help="runs per sweep figure")
    add("--json", action="store_true", help="print one JSON object")
    add("--seed", type=int, default=20260301, help="data generator seed")
    add("--timeout", type=float, default=900.0, help="overall limit, seconds")
    add("--redis-url", default=os.environ.get("RELAY_BACKLOG_REDIS_URL", "redis://127.0.0.1:6379/13"),
        help="the Redis database the sweeper enqueues on (must be empty; flushed)")  # fmt: skip
    pg = os.environ.get("RELAY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    add("--pg-admin-dsn", default=pg, help="where to CREATE the databases")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(part.replace("_", "")) for part in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes: a comma-separated list of integers")
    harness.require_local(args.redis_url, "Redis")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main("bench_backlog", lambda: run_bench(args), args.json)


if __name__ == "__main__":
    sys.exit(main())
