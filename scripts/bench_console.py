"""How fast the console answers over a big store: 1,000,000 events, 100,000 dead deliveries.

Fills a SQLite store (kept in ``--database`` and reused by later runs), starts `relay serve`
on it, logs in to the console and times each page over HTTP: the events page (newest, by
platform id, by kind, by kind and event name, by time range, a page deep in the list), the
deliveries page (dead, dead to one destination, a deep page), the bulk replay's count, the
destinations page and the quarantine. The baseline is `GET /healthz` of the same server, timed
the same way in the same run; each line prints the median and p95 in ms and the ratio of the
median to the baseline's.

    python scripts/bench_console.py                   # 1,000,000 events, 100,000 dead
    python scripts/bench_console.py --events 100000 --dead 10000 --json
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
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from benchlib import (
    HOST,
    free_port,
    relay_argv,
    relay_env,
    start_server,
    stop_server,
)

from receivers.ids import new_ids
from receivers.store import create_engine
from relay import migrate

USER, PASSWORD = "bench", "a password for the bench"
DESTINATIONS = ("orders", "archive", "crm", "analytics")
KINDS = (
    ("sms.dlr", "requestId", "delivered"),
    ("sms.inbound", "requestId", None),
    ("conversations.status", "messageId", "messagestatus::delivered"),
    ("tts.event", "callId", "completed"),
    ("numinfo.gnp", "requestId", None),
)
STORE_SPAN = timedelta(days=30)
END = datetime(2026, 11, 1, tzinfo=UTC)
CHUNK = 20_000
CSRF = re.compile(r'name="csrf" value="([^"]*)"')
TOKEN = re.compile(r'name="token" value="([^"]*)"')
NEXT = re.compile(r'href="/console/(?:events|deliveries)\?([^"]*before=[^"]*)" rel="next"')


def sqlite_time(moment: datetime) -> str:
    """A time as the store keeps it in SQLite (naive UTC, microseconds)."""
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def event_rows(count: int, seed: int) -> Iterator[tuple[object, ...]]:
    rng = random.Random(seed)
    step = STORE_SPAN / count
    for start in range(0, count, CHUNK):
        size = min(CHUNK, count - start)
        first = END - STORE_SPAN + step * start
        ids = new_ids(first, size)
        for offset, event_id in enumerate(ids):
            index = start + offset
            kind, field, event = KINDS[index % len(KINDS)]
            platform_id = f"id-{index:07d}"
            payload = {
                field: platform_id,
                "status": event,
                "to": f"+49151{rng.randrange(10**7):07d}",
            }
            body = json.dumps(payload).encode()
            yield (
                event_id,
                "default",
                kind,
                f"{platform_id}|{event}" if event else platform_id,
                sqlite_time(first + step * offset),
                json.dumps(payload),
                body,
                "application/json",
                "POST",
                "127.0.0.1",
                0,
                platform_id,
                event,
            )


def fill(database: Path, events: int, dead: int, seed: int) -> None:
    """Create the store and fill it (events, then one delivery per event for the first
    ``dead`` events as dead, the rest succeeded for a tenth of them, one attempt each dead)."""
    engine = create_engine(f"sqlite:///{database}")
    asyncio.run(migrate.upgrade(engine))
    asyncio.run(engine.dispose())
    started = time.perf_counter()
    with sqlite3.connect(database) as conn:
        conn.execute("PRAGMA synchronous = OFF")
        conn.executemany(
            "INSERT INTO received_events (id, source, kind, dedup_key, received_at, payload, "
            "raw_body, content_type, method, remote_addr, duplicates, platform_id, event_name) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            event_rows(events, seed),
        )
        conn.commit()
        print(f"  {events:,} events in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        rows = conn.execute("SELECT id, received_at FROM received_events ORDER BY id").fetchall()
        deliveries, attempts = [], []
        every = max(1, len(rows) // (dead * 2)) if dead else len(rows)
        for number, (event_id, received_at) in enumerate(rows[::every]):
            status = "dead" if number < dead else "succeeded"
            (delivery_id,) = new_ids(datetime.fromisoformat(received_at).replace(tzinfo=UTC), 1)
            deliveries.append(
                (
                    delivery_id,
                    event_id,
                    DESTINATIONS[number % len(DESTINATIONS)],
                    "standard",
                    status,
                    1,
                    0,
                    received_at,
                    received_at,
                    received_at,
                    None,
                    received_at,
                    500 if status == "dead" else 200,
                )
            )
            attempts.append(
                (delivery_id, 1, received_at, 12.5, 500 if status == "dead" else 200, None)
            )
        conn.executemany(
            "INSERT INTO deliveries (id, event_id, destination, policy, status, attempts, "
            "schedule_base, created_at, first_attempt_at, last_attempt_at, next_attempt_at, "
            "finished_at, last_status_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            deliveries,
        )
        conn.executemany(
            "INSERT INTO delivery_attempts (delivery_id, number, started_at, duration_ms, "
            "status_code, error) VALUES (?, ?, ?, ?, ?, ?)",
            attempts,
        )
        conn.execute(
            "INSERT INTO routed_events (event_id, routed_at, deliveries) "
            "SELECT id, received_at, 1 FROM received_events"
        )
        conn.commit()
        conn.execute("ANALYZE")
    print(
        f"  filled in {time.perf_counter() - started:.0f} s: {len(deliveries):,} deliveries, "
        f"{min(dead, len(deliveries)):,} dead",
        file=sys.stderr,
    )


def counts(database: Path) -> tuple[int, int]:
    with sqlite3.connect(database) as conn:
        events = conn.execute("SELECT count(*) FROM received_events").fetchone()[0]
        dead = conn.execute("SELECT count(*) FROM deliveries WHERE status = 'dead'").fetchone()[0]
    return int(events), int(dead)


def timed(
    client: httpx.Client, method: str, path: str, runs: int, **options: object
) -> list[float]:
    """Milliseconds of ``runs`` requests (each must answer 200)."""
    latencies = []
    for _ in range(runs):
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


def deep_query(client: httpx.Client, path: str, pages: int) -> str:
    """The query string of the page ``pages`` pages down from ``path``."""
    query = ""
    for _ in range(pages):
        found = NEXT.search(client.get(f"{path}?{query}" if query else path).text)
        if found is None:
            break
        query = found[1].replace("&amp;", "&")
    return query


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=20, help="requests per page")
    parser.add_argument("--database", type=Path, help="the store file (kept; default: a temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-console-"))
    database = args.database or workdir / "relay.db"
    if not database.exists() or counts(database) != (args.events, args.dead):
        database.unlink(missing_ok=True)
        print(f"filling {database} ...", file=sys.stderr)
        fill(database, args.events, args.dead, args.seed)
    config = workdir / "relay.toml"
    destinations = "\n".join(
        f'[destinations.{name}]\ntype = "http"\nurl = "http://{HOST}:9/"\n' for name in DESTINATIONS
    )
    config.write_text(
        f'database_url = "sqlite:///{database}"\n[console.users]\n{USER} = "{PASSWORD}"\n'
        + destinations
    )
    port = free_port()
    server = start_server("relay", relay_argv(port, config), port, workdir, relay_env())
    results: dict[str, dict[str, float]] = {}
    try:
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=60) as client:
            for _ in range(600):
                if server.process.poll() is not None:
                    raise SystemExit(f"relay serve stopped: {server.log_tail()}")
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            csrf = login(client)
            middle = sqlite_time(END - STORE_SPAN / 2)[:19].replace(" ", "T")
            later = sqlite_time(END - STORE_SPAN / 2 + timedelta(hours=1))[:19].replace(" ", "T")
            pages = {
                "events, newest": "/console/events",
                "events, by platform id": f"/console/events?q=id-{args.events // 2:07d}",
                "events, by kind": "/console/events?kind=tts.event",
                "events, by kind and event": "/console/events?kind=sms.dlr&event=delivered",
                "events, one hour": f"/console/events?since={middle}&until={later}",
                "events, 200 pages deep": "/console/events?"
                + deep_query(client, "/console/events", 200),
                "deliveries, dead": "/console/deliveries?status=dead",
                "deliveries, dead to one": "/console/deliveries?status=dead&destination=orders",
                "deliveries, 200 pages deep": "/console/deliveries?"
                + deep_query(client, "/console/deliveries?status=dead", 200),
                "destinations": "/console/destinations",
                "quarantine": "/console/quarantine",
            }
            baseline = timed(client, "GET", "/healthz", args.runs * 2)
            results["baseline: /healthz"] = summary(baseline, baseline)
            for name, path in pages.items():
                results[name] = summary(timed(client, "GET", path, args.runs), baseline)
            count = timed(
                client,
                "POST",
                "/console/deliveries/replay",
                args.runs,
                data={"csrf": csrf, "destination": ""},
            )
            results["bulk replay: count all dead"] = summary(count, baseline)
    finally:
        stop_server(server)
    events, dead = counts(database)
    if args.json:
        print(json.dumps({"events": events, "dead": dead, "pages": results}))
        return
    print(f"{events:,} events, {dead:,} dead deliveries, {args.runs} requests per page")
    print(f"{'page':<30} {'median ms':>10} {'p95 ms':>8} {'ratio':>7}")
    for name, figures in results.items():
        print(
            f"{name:<30} {figures['median_ms']:>10.1f} {figures['p95_ms']:>8.1f} "
            f"{figures['ratio']:>7.1f}"
        )


def summary(latencies: list[float], baseline: list[float]) -> dict[str, float]:
    median = statistics.median(latencies)
    return {
        "median_ms": round(median, 2),
        "p95_ms": round(latencies[max(0, int(len(latencies) * 0.95) - 1)], 2),
        "ratio": round(median / statistics.median(baseline), 2),
    }


if __name__ == "__main__":
    main()
