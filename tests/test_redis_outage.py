"""`relay serve` and `relay worker` through a Redis restart, and through PostgreSQL connections
terminated: no process exits, `relay serve` answers every callback, every acknowledged event
reaches the destination, and each outage is one line when it begins and one when it ends in
each process that met it, never a traceback.

Real processes: the CLI's `relay serve` and `relay worker` on a PostgreSQL database of the
test's own, a private ``redis-server`` (append-only file, as the operations page advises) that
the test stops with SIGTERM or SIGKILL and starts again on the same port, and an HTTP sink.
A Redis lost in the middle of a sweep is played in this process, on the same kind of Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import create_engine
from relay import outbox
from relay.destinations import parse_destination_config
from relay.dispatch.jobs import QUEUE_NAME, JobQueue, open_pool
from relay.dispatch.queue_connection import QueueConnection
from relay.outbox.router import Router
from relay.outbox.sweeper import Sweeper
from relay.simulator import factories
from relay.store import migrate
from tests.conftest import (
    PG_ADMIN_DSN,
    TOKEN,
    create_postgres_database,
    drop_postgres_database,
    service_missing,
)
from tests.metrics_support import sample
from tests.outage_support import RestartableRedis
from tests.relay_support import Clock, store_events
from tests.store_support import eventually, within
from tests.support import Answer, Sink, free_port, pause_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
START_SECONDS = 60.0
"""How long a process may take to start on a loaded machine."""
DELIVERY_SECONDS = 90.0
"""How long every acknowledged event may take to reach the sink after an outage."""
KINDS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    ("/hooks/sms/inbound", factories.sms_inbound),
    ("/hooks/sms/dlr", factories.sms_dlr),
    ("/hooks/numinfo/gnp", factories.numinfo_gnp),
    ("/hooks/conversations", factories.conversations_status),
    ("/hooks/tts/events", factories.tts_event),
]


@dataclass
class Process:
    """A `relay` command running as a subprocess, its output in ``log``."""

    name: str
    process: asyncio.subprocess.Process
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def count(self, words: str) -> int:
        return self.text().count(words)

    @property
    def running(self) -> bool:
        return self.process.returncode is None


@dataclass
class Deployment:
    """One `relay serve` and one `relay worker` sharing a database and the private Redis."""

    redis: RestartableRedis
    sink: Sink
    database: str
    database_url: str
    serve: Process
    worker: Process
    url: str
    worker_metrics_url: str
    acked: set[str] = field(default_factory=set)
    answers: list[int] = field(default_factory=list)

    def delivered(self) -> set[str]:
        return {r.headers["webhook-id"] for r in self.sink.requests}

    async def post(self, client: httpx.AsyncClient, count: int, *, retry: bool = False) -> None:
        """POST ``count`` callbacks, each answer kept; with ``retry``, a callback not answered
        200 is sent again, as the platform does."""
        for index in range(count):
            path, factory = KINDS[index % len(KINDS)]
            body = factory()
            while True:
                answer = await client.post(f"{self.url}{path}?token={TOKEN}", json=body)
                self.answers.append(answer.status_code)
                if answer.status_code == 200:
                    self.acked.add(answer.json()["id"])
                    break
                if not retry:
                    break

    async def all_delivered(self) -> None:
        try:
            await eventually(lambda: self.delivered() >= self.acked, timeout=DELIVERY_SECONDS)
        except AssertionError:
            missing = len(self.acked - self.delivered())
            raise AssertionError(
                f"{missing} acknowledged events not delivered\n{self.logs()}"
            ) from None

    async def queue_connected(self) -> tuple[float | None, float | None]:
        """``relay_queue_connected`` as `relay serve` and `relay worker` serve it (serve's
        figures may be up to a second old: its exposition is shared by the scrapes)."""
        async with httpx.AsyncClient() as client:
            serve = (await client.get(f"{self.url}/metrics")).text
            worker = (await client.get(f"{self.worker_metrics_url}/metrics")).text
        return sample(serve, "relay_queue_connected"), sample(worker, "relay_queue_connected")

    async def queue_connected_is(self, expected: tuple[float, float]) -> bool:
        return await self.queue_connected() == expected

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.text()[-6000:]}" for p in (self.serve, self.worker))

    def assert_alive(self) -> None:
        assert self.serve.running and self.worker.running, self.logs()


def config_text(database_url: str, redis_url: str, sink: Sink) -> str:
    return "\n".join(
        [
            f'database_url = "{database_url}"',
            f'redis_url = "{redis_url}"',
            'sweep_interval = "1s"',
            'lease_margin = "3s"',
            "[sources.default]",
            f'token = "{TOKEN}"',
            "[destinations.crm]",
            'type = "http"',
            f'url = "{sink.url()}"',
            'timeout = "1s"',
            'policy = "quick"',
            "[policies.quick]",
            'type = "delays"',
            'delays = ["1s"]',
            'then = "1s"',
            'give_up_after = "10m"',
            "",
        ]
    )


async def start(name: str, tmp_path: Path, *args: str) -> Process:
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "relay",
            *args,
            "--config",
            str(tmp_path / "relay.toml"),
            cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "RELAY_CONFIG": ""},
        )
    return Process(name, process, log)


async def stop(process: Process) -> int:
    if process.running:
        process.process.terminate()
    try:
        return await asyncio.wait_for(process.process.wait(), 30)
    except TimeoutError:
        process.process.kill()
        return await process.process.wait()


async def ready(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=1) as client:
            return (await client.get(f"{url}/readyz")).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def restartable_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableRedis]:
    """A private Redis the test stops and starts again (missing ``redis-server``: fails under
    CI=true, skipped otherwise)."""
    binary = shutil.which("redis-server")
    if binary is None:
        service_missing("redis-server (for a private Redis)", FileNotFoundError("redis-server"))
    assert binary is not None
    redis = RestartableRedis(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield redis
    finally:
        redis.close()


@pytest.fixture
async def deployment(
    restartable_redis: RestartableRedis,
    sink: Sink,
    tmp_path: Path,
) -> AsyncIterator[Deployment]:
    database, database_url = await create_postgres_database("relay_outage")
    engine = create_engine(database_url)
    try:
        await migrate.upgrade(engine)
    finally:
        await engine.dispose()
    (tmp_path / "relay.toml").write_text(config_text(database_url, restartable_redis.url, sink))
    port = free_port()
    serve = await start("serve", tmp_path, "serve", "--port", str(port), "--no-access-log")
    metrics_port = free_port()
    worker = await start("worker", tmp_path, "worker", "--metrics-port", str(metrics_port))
    deployment = Deployment(
        restartable_redis,
        sink,
        database,
        database_url,
        serve,
        worker,
        f"http://127.0.0.1:{port}",
        f"http://127.0.0.1:{metrics_port}",
    )
    try:
        await eventually(lambda: ready(deployment.url), timeout=START_SECONDS)
        await eventually(lambda: worker.count("relay worker started"), timeout=START_SECONDS)
        yield deployment
    finally:
        await stop(worker)
        await stop(serve)
        await drop_postgres_database(database)


def assert_one_outage(process: Process) -> None:
    """One line when the queue was lost, one when it was back, and no traceback."""
    output = process.text()
    assert output.count("queue lost: ") == 1, output
    assert output.count("queue back after ") == 1, output
    assert "Traceback" not in output, output


async def until_logged(process: Process, words: str, count: int = 1) -> None:
    await eventually(lambda: process.count(words) >= count, timeout=START_SECONDS)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_a_redis_restart_with_deliveries_in_flight_loses_nothing(
    how: signal.Signals, deployment: Deployment
) -> None:
    deployment.sink.answers["/hook"] = Answer(200, delay=0.3)  # the first deliveries in flight
    async with httpx.AsyncClient() as client:
        await deployment.post(client, 40)
        await eventually(lambda: len(deployment.sink.requests) >= 5)

        deployment.redis.stop(how)
        await deployment.post(client, 20)  # accepted while Redis is away
        await until_logged(deployment.worker, "queue lost: ")
        await until_logged(deployment.serve, "queue lost: ")
        await eventually(lambda: deployment.queue_connected_is((0, 0)))
        assert await ready(deployment.url)  # callbacks are still taken: ready
        deployment.redis.start()
        await until_logged(deployment.worker, "queue back after ")
        await until_logged(deployment.serve, "queue back after ")
        await eventually(lambda: deployment.queue_connected_is((1, 1)))

        await deployment.all_delivered()
    assert deployment.answers == [200] * 60
    assert len(deployment.acked) == 60
    deployment.assert_alive()
    assert_one_outage(deployment.worker)
    assert_one_outage(deployment.serve)


async def test_a_redis_that_hangs_is_lost_and_back_like_one_that_stops(
    deployment: Deployment,
) -> None:
    """A stopped server (or a partition that drops packets) accepts nothing and refuses
    nothing: the commands time out, which is an outage like a refused connection."""
    async with httpx.AsyncClient() as client:
        await deployment.post(client, 5)
        await deployment.all_delivered()
        pause_process(deployment.redis.process)
        try:
            await deployment.post(client, 10)  # accepted while Redis hangs
            await until_logged(deployment.worker, "queue lost: ")
            await until_logged(deployment.serve, "queue lost: ")
            await eventually(lambda: deployment.queue_connected_is((0, 0)))
        finally:
            deployment.redis.process.send_signal(signal.SIGCONT)
        await until_logged(deployment.worker, "queue back after ")
        await until_logged(deployment.serve, "queue back after ")
        await deployment.all_delivered()
    assert deployment.answers == [200] * 15
    deployment.assert_alive()
    assert_one_outage(deployment.worker)
    assert_one_outage(deployment.serve)


async def test_an_idle_worker_rides_out_a_redis_restart(deployment: Deployment) -> None:
    deployment.redis.stop(signal.SIGKILL)
    await until_logged(deployment.worker, "queue lost: ")
    deployment.redis.start()
    await until_logged(deployment.worker, "queue back after ")

    async with httpx.AsyncClient() as client:
        await deployment.post(client, 10)
    await deployment.all_delivered()
    deployment.assert_alive()
    assert_one_outage(deployment.worker)
    serve = deployment.serve.text()  # it enqueued nothing meanwhile: it may not have noticed
    assert serve.count("queue lost: ") == serve.count("queue back after ") <= 1, serve
    assert "Traceback" not in serve, serve


async def test_sigterm_stops_both_processes_promptly_and_cleanly_while_redis_is_away(
    deployment: Deployment,
) -> None:
    deployment.redis.stop(signal.SIGKILL)
    async with httpx.AsyncClient() as client:
        await deployment.post(client, 3)  # `relay serve` finds Redis gone too
    await until_logged(deployment.worker, "queue lost: ")
    await until_logged(deployment.serve, "queue lost: ")
    for process in (deployment.worker, deployment.serve):
        process.process.terminate()
        await within(process.process.wait(), timeout=15)
        assert "Traceback" not in process.text(), process.text()
    assert deployment.worker.process.returncode == 0, deployment.worker.text()
    assert deployment.answers == [200] * 3
    deployment.redis.start()


async def test_postgresql_connections_terminated_lose_nothing(deployment: Deployment) -> None:
    """Every connection of the test's database is terminated five times while callbacks arrive
    and deliveries are made; the platform retries what is answered 503."""
    deployment.sink.answers["/hook"] = Answer(200, delay=0.05)
    admin = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    terminated = 0
    try:
        async with httpx.AsyncClient() as client:
            traffic = asyncio.create_task(deployment.post(client, 150, retry=True))
            for round_ in range(5):
                await eventually(lambda r=round_: len(deployment.sink.requests) >= 10 * (r + 1))
                terminated += await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = $1 AND pid <> pg_backend_pid()",
                    deployment.database,
                )
            await within(traffic, timeout=DELIVERY_SECONDS)
        await deployment.all_delivered()
    finally:
        await admin.close()
    assert terminated >= 5  # each round found the processes' connections
    assert len(deployment.acked) == 150
    deployment.assert_alive()
    for process in (deployment.serve, deployment.worker):
        await eventually(
            lambda p=process: (
                p.count("the store refuses the relay's writes")
                == p.count("the store takes the relay's writes again")
            )
        )
    worker = deployment.worker.text()
    assert "Traceback" not in worker, worker
    assert "after-commit hook failed" not in deployment.serve.text()


async def test_a_redis_killed_during_a_sweep_is_swept_again_once_it_is_back(
    restartable_redis: RestartableRedis,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis is SIGKILLed while a sweep reads the due deliveries from the database, so the
    sweep's next step meets a lost queue; once Redis is back, the next sweep runs at once
    (the interval is an hour) and queues a job for every due delivery."""
    caplog.set_level("INFO")
    clock = Clock()
    posts = [(KINDS[0][0], factories.sms_inbound()) for _ in range(5)]
    await store_events(engine, posts, clock)
    router = Router({"crm": parse_destination_config({"type": "http", "url": "http://x/"})})
    clock.advance(timedelta(minutes=1))
    events = await outbox.unrouted_events(engine, clock(), 100)
    await outbox.route_events(engine, router, events, clock())  # their jobs: never enqueued

    def kill_redis_once(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "deliveries" in statement and "ORDER BY" in statement and kill_redis_once.armed:
            kill_redis_once.armed = False  # type: ignore[attr-defined]
            restartable_redis.stop(signal.SIGKILL)

    kill_redis_once.armed = True  # type: ignore[attr-defined]
    event.listen(engine.sync_engine, "before_cursor_execute", kill_redis_once)
    pool = await open_pool(restartable_redis.url)
    connection = QueueConnection(pool)
    sweeper = Sweeper(
        engine,
        router,
        JobQueue(pool, clock=clock, connection=connection),
        clock=clock,
        interval=timedelta(hours=1),
    )
    task = asyncio.create_task(sweeper.run())
    try:
        await eventually(lambda: not connection.connected)
        restartable_redis.start()
        await eventually(lambda: _queued(pool, 5))
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        event.remove(engine.sync_engine, "before_cursor_execute", kill_redis_once)
        await connection.aclose()
        await pool.aclose()
    lines = [r.getMessage() for r in caplog.records if r.name == "relay.queue_connection"]
    assert [line.split(":")[0].split(" after ")[0] for line in lines] == [
        "queue lost",
        "queue back",
    ]
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= 20]


async def _queued(pool: Any, count: int) -> bool:
    return await pool.zcard(QUEUE_NAME) == count  # type: ignore[no-any-return]
