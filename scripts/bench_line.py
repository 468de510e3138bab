"""Line drain benchmark: how fast `relay worker` drains one key's stored line, two trees compared.

A backlog of ``--events`` (2,000) SMS delivery reports of ONE message (one ``requestId``, each
with a status of its own) is stored once: `relay serve` receives them with ``redis_url`` set, so
no worker runs in it, and routes them to ``[destinations.sink]`` (type http, ``ordering =
"per-key"``): one line of 2,000 deliveries, all due. The database is SQLite in a temporary
directory, or with ``--database postgresql`` a database of the run's own (``--pg-admin-dsn``).

Then, ``--rounds`` times, each tree in turn (``--before DIR``, then ``--after DIR``, default this
checkout): a copy of the backlog (the SQLite file, or ``CREATE DATABASE ... TEMPLATE``), a private
``redis-server`` emptied, and ONE `relay worker` (``PYTHONPATH=DIR``) alone drains it into the
recording sink of ``scripts/harness.py``. Figure: deliveries/s = (N - 1) / (last - first arrival
at the sink), so start-up does not count; also the worker's CPU per delivery over the run. A
run fails when an event does not arrive within ``--drain-timeout`` or arrives out of order.
Prints each run, the median of each tree and the ratio after / before.

    python3 scripts/bench_line.py --before /path/to/main [--after .] [--database postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import redis
from benchlib import (
    HOST,
    BenchError,
    Server,
    admin_execute,
    free_port,
    process_cpu_seconds,
    relay_argv,
    relay_command,
    relay_env,
    start_server,
    stop_server,
    wait_ready,
)

from relay.simulator import factories

TOKEN = secrets.token_urlsafe(24)
KEY = "line-0000-0000-0000-000000000001"


def write_config(path: Path, database_url: str, redis_url: str, sink_url: str) -> Path:
    path.write_text(
        f'database_url = "{database_url}"\nredis_url = "{redis_url}"\n\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n\n'
        f'[destinations.sink]\ntype = "http"\nurl = "{sink_url}"\nformat = "envelope"\n'
        'ordering = "per-key"\n',
        encoding="utf-8",
    )
    return path


class Store:
    """The backlog's database and its copies: SQLite files or PostgreSQL databases."""

    def __init__(self, kind: str, admin_dsn: str, workdir: Path) -> None:
        self.kind, self.admin_dsn, self.workdir = kind, admin_dsn, workdir
        self.made: list[str] = []

    def url(self, name: str) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.workdir / (name + '.db')}"
        base = self.admin_dsn.rsplit("/", 1)[0]
        return f"{base.replace('postgresql://', 'postgresql+asyncpg://', 1)}/{name}"

    async def create(self, name: str, template: str | None = None) -> str:
        if self.kind == "sqlite":
            if template is not None:
                for suffix in (".db", ".db-wal", ".db-shm"):
                    source = self.workdir / (template + suffix)
                    if source.exists():
                        shutil.copyfile(source, self.workdir / (name + suffix))
            return self.url(name)
        like = f' TEMPLATE "{template}"' if template else ""
        await admin_execute(self.admin_dsn, f'CREATE DATABASE "{name}"{like}')
        self.made.append(name)
        return self.url(name)

    async def drop_all(self) -> None:
        for name in self.made:
            await admin_execute(self.admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def relay(args: list[str], config: Path, workdir: Path, tree: Path) -> str:
    """Run a `relay` command of ``tree``; its output."""
    env = {**relay_env(), "PYTHONPATH": str(tree)}
    run = subprocess.run(
        [*relay_command(), *args, "--config", str(config)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if run.returncode != 0:
        raise BenchError(f"relay {' '.join(args)} failed:\n{run.stdout}{run.stderr}")
    return run.stdout


async def store_backlog(
    store: Store, workdir: Path, tree: Path, redis_url: str, sink_url: str, n: int
) -> None:
    """Receive and route the line with `relay serve` of ``tree``, into the database "backlog"."""
    url = await store.create("backlog")
    config = write_config(workdir / "serve.toml", url, redis_url, sink_url)
    if store.kind == "postgresql":
        relay(["db", "upgrade"], config, workdir, tree)
    port = free_port()
    env = {**relay_env(), "PYTHONPATH": str(tree)}
    serve = start_server("serve", relay_argv(port, config), port, workdir, env)
    try:
        await wait_ready(serve, "/readyz")
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", trust_env=False) as client:
            for step in range(n):
                body = factories.sms_dlr({"requestId": KEY}, status=f"STEP{step}")
                answer = await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=body)
                answer.raise_for_status()
            for _ in range(600):  # routed after the hook's delay: until the line is complete
                pending = ["deliveries", "list", "--status", "pending", "--limit", str(n + 1)]
                listed = relay([*pending, "--json"], config, workdir, tree)
                if len(json.loads(listed)) == n:
                    break
                await asyncio.sleep(0.5)
            else:
                raise BenchError("the backlog was not routed in time")
    finally:
        stop_server(serve)


async def drain(
    args: argparse.Namespace, store: Store, tree: Path, number: int, redis_url: str, sink: Server
) -> tuple[float, float]:
    """One worker of ``tree`` drains a copy of the backlog: (deliveries/s, CPU ms/delivery)."""
    name = f"line_{os.getpid()}_{number}"
    config = write_config(
        args.workdir / f"{name}.toml",
        await store.create(name, "backlog"),
        redis_url,
        f"http://{HOST}:{sink.port}/relay",
    )
    redis.Redis.from_url(redis_url).flushall()  # the private instance's, no other user
    base = f"http://{HOST}:{sink.port}/_sink"
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        (await client.post(f"{base}/reset")).raise_for_status()
        argv = [*relay_command(), "worker", "--config", str(config), "--log-level", "warning"]
        env = {**relay_env(), "PYTHONPATH": str(tree)}
        worker = start_server(name, argv, 0, args.workdir, env)
        try:
            deadline = time.monotonic() + args.drain_timeout
            started: tuple[int, float] | None = None  # (arrived, worker CPU) once they arrive
            while (arrived := (await client.get(f"{base}/count")).json()["distinct"]) < args.events:
                if time.monotonic() > deadline or worker.process.poll() is not None:
                    raise BenchError(f"{tree}: the line did not drain\n{worker.log_tail()}")
                if started is None and arrived:
                    started = arrived, process_cpu_seconds(worker.process.pid)
                await asyncio.sleep(0.1)
            counted, cpu_before = started or (0, process_cpu_seconds(worker.process.pid))
            cpu = process_cpu_seconds(worker.process.pid) - cpu_before
        finally:
            stop_server(worker)
        records = (await client.get(f"{base}/records")).json()
    first: dict[str, tuple[float, float]] = {}
    for webhook_id, received_at, lag in records:  # received_at: epoch seconds
        first.setdefault(webhook_id, (received_at + lag, received_at))
    arrivals = sorted((arrived, received, wid) for wid, (arrived, received) in first.items())
    line = [(received, wid) for _, received, wid in arrivals]
    if line != sorted(line):
        raise BenchError(f"{tree}: the line arrived out of order")
    span = arrivals[-1][0] - arrivals[0][0]
    return (len(arrivals) - 1) / span, cpu * 1000 / max(len(arrivals) - counted, 1)


async def run(args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    store = Store(args.database, args.pg_admin_dsn, args.workdir)
    redis_port = free_port()
    redis_argv = ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"]
    servers = [start_server("redis", redis_argv, redis_port, args.workdir, dict(os.environ))]
    sink_port = free_port()
    sink = start_server("sink", harness.sink_argv(sink_port), sink_port, args.workdir, relay_env())
    servers.append(sink)
    redis_url = f"redis://{HOST}:{redis_port}/0"
    results: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    try:
        await wait_ready(sink, "/_sink/healthz")
        sink_url = f"http://{HOST}:{sink_port}/relay"
        await store_backlog(store, args.workdir, args.after, redis_url, sink_url, args.events)
        for number in range(args.rounds * 2):
            which = ("before", "after")[number % 2]
            rate, cpu = await drain(args, store, getattr(args, which), number, redis_url, sink)
            results[which].append((rate, cpu))
            print(f"{which:6}  {rate:8.1f} deliveries/s  {cpu:5.2f} ms CPU/delivery", flush=True)
    finally:
        for server in reversed(servers):
            stop_server(server)
        await store.drop_all()
    return results


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-line-") as directory:
        yield Path(directory)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the baseline's tree")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--pg-admin-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    args = parser.parse_args()
    args.before, args.after = args.before.resolve(), args.after.resolve()
    with workdir() as args.workdir:
        try:
            results = asyncio.run(run(args))
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    before, after = (statistics.median(r for r, _ in results[w]) for w in ("before", "after"))
    print(f"median before {before:.1f}/s, after {after:.1f}/s: ratio {after / before:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
