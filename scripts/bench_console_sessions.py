"""What the console's per-request session lookup costs, against a database round trip.

Every console request reads its session from the database (no per-process cache, so a logout
reaches every replica at once). This script fills ``console_sessions`` with ``--sessions``
rows and times, in-process on one engine, in the same run:

- ``SELECT 1``: the baseline, one round trip;
- the session check (``Sessions.operator``): one primary-key read;
- a whole console page (the quarantine, empty) through the ASGI app, session check included.

Each line prints the median and p95 in microseconds and the median's ratio to the baseline's;
the last line says what share of the page the check is.

    python scripts/bench_console_sessions.py                       # SQLite, a temporary file
    python scripts/bench_console_sessions.py --database postgresql://postgres@127.0.0.1/bench
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Mount

from receivers.store import create_engine
from relay.console.app import console_app
from relay.console.sessions import SESSION_COOKIE, SESSIONS, Sessions, session_id
from relay.console.users import Users
from relay.outbox import Due
from relay.store import migrate

USER, PASSWORD, KEY = "bench", "a password for the bench", "a key for the bench"
LIFETIME = timedelta(hours=12)
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
BATCH = 5_000


async def fill(engine: AsyncEngine, sessions: Sessions, count: int) -> str:
    """``count`` sessions of other browsers, and one of ours: its cookie."""
    users = Users(KEY, {USER: PASSWORD})
    fingerprint = users.fingerprint(USER)
    async with engine.begin() as conn:
        for start in range(0, count, BATCH):
            rows = [
                {
                    "id": session_id(f"other-{n}"),
                    "user_name": USER,
                    "password_fingerprint": fingerprint,
                    "created_at": NOW,
                    "last_seen_at": NOW,
                    "expires_at": NOW + LIFETIME,
                }
                for n in range(start, min(count, start + BATCH))
            ]
            await conn.execute(insert(SESSIONS), rows)
    return await sessions.open(USER)


async def timed(repeat: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(min(50, repeat)):  # warm up: connections, statement caches
        await step()
    durations = []
    for _ in range(repeat):
        started = time.perf_counter()
        await step()
        durations.append((time.perf_counter() - started) * 1e6)
    return durations


async def bench(database_url: str, count: int, repeat: int) -> None:
    engine = create_engine(database_url)
    await migrate.upgrade(engine)
    async with engine.begin() as conn:
        await conn.execute(SESSIONS.delete())
    users = Users(KEY, {USER: PASSWORD})
    sessions = Sessions(engine, users, KEY, LIFETIME, lambda: NOW)
    cookie = await fill(engine, sessions, count)

    async def round_trip() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def check() -> None:
        assert await sessions.operator(cookie) is not None

    async def enqueue(due: list[Due]) -> None:
        return None

    app = Starlette(
        routes=[
            Mount(
                "/console",
                console_app(
                    engine,
                    users,
                    KEY,
                    enqueue,
                    sources=["default"],
                    destinations=[],
                    clock=lambda: NOW,
                    session_lifetime=LIFETIME,
                ),
            )
        ]
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client:
        client.cookies.set(SESSION_COOKIE, cookie)

        async def page() -> None:
            answer = await client.get("/console/quarantine")
            assert answer.status_code == 200, answer.status_code

        results = {
            "SELECT 1 (baseline)": await timed(repeat, round_trip),
            "session check": await timed(repeat, check),
            "quarantine page": await timed(repeat, page),
        }
    await engine.dispose()
    base = statistics.median(results["SELECT 1 (baseline)"])
    print(f"{engine.dialect.name}, {count:,} sessions, {repeat} requests each")
    for name, durations in results.items():
        median = statistics.median(durations)
        p95 = statistics.quantiles(durations, n=20)[-1]
        print(f"  {name:<22} median {median:8.0f} us  p95 {p95:8.0f} us  x{median / base:5.2f}")
    share = statistics.median(results["session check"]) / statistics.median(
        results["quarantine page"]
    )
    print(f"  the session check is {share:.0%} of the page")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--sessions", type=int, default=100_000, help="rows in the table")
    parser.add_argument("--repeat", type=int, default=500, help="timed calls of each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        url = args.database or f"sqlite:///{Path(scratch) / 'sessions.db'}"
        asyncio.run(bench(url, args.sessions, args.repeat))


if __name__ == "__main__":
    main()
