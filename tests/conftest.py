"""Shared fixtures: a store on SQLite or PostgreSQL, and in-process receiver clients."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import redis as redis_sync
import trustme
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import ReceiverConfig, SourceConfig, create_app
from receivers.store.engine import create_engine
from relay.store import migrate

if TYPE_CHECKING:
    from tests.amqp_support import Rabbit
from tests.support import Sink, free_port, serving, stop_process

REDIS_URL = os.environ.get("RELAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_ADMIN_DSN = os.environ.get("RELAY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"
PRIVATE_REDIS_START_TIMEOUT_S = 10.0
TOKEN = "t0ken-for-the-tests"
TABLES = (
    "delivery_attempts",
    "deliveries",
    "routed_events",
    "destination_states",
    "received_events",
    "rejected_bodies",
    "relay_instance_settings",
    "console_sessions",
    "console_login_throttle",
)


def service_missing(what: str, error: BaseException) -> None:
    """Fail under CI (the service must be there), skip on a developer machine."""
    message = f"{what} is not reachable: {error!r}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


async def pg_admin(sql: str) -> None:
    """Run one statement as PostgreSQL's administrator (creating or dropping a database)."""
    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def create_postgres_database(prefix: str) -> tuple[str, str]:
    """A new, empty PostgreSQL database: its name and its URL (asyncpg). PostgreSQL missing
    fails the test under CI, else skips it."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        await pg_admin(f'CREATE DATABASE "{name}"')
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        service_missing("PostgreSQL", exc)
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return name, f"{base}/{name}"


async def drop_postgres_database(name: str) -> None:
    await pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test run, migrated, dropped at the end."""
    name, url = asyncio.run(create_postgres_database("relay_test"))

    async def upgrade() -> None:
        engine = create_engine(url)
        await migrate.upgrade(engine)
        await engine.dispose()

    asyncio.run(upgrade())
    yield url
    asyncio.run(drop_postgres_database(name))


@pytest.fixture(scope="session")
def amqp_vhost() -> Iterator[tuple[str, str]]:
    """This test run's RabbitMQ vhost (name, URL), deleted at the end."""
    from tests.amqp_support import vhost_of_the_run  # it uses service_missing, above

    with vhost_of_the_run() as vhost:
        yield vhost


@pytest.fixture
async def rabbit(amqp_vhost: tuple[str, str]) -> AsyncIterator[Rabbit]:
    """A test-side RabbitMQ client on the run's vhost."""
    from tests.amqp_support import rabbit_on

    async with rabbit_on(*amqp_vhost) as helper:
        yield helper


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A private certificate authority for the TLS tests (brokers' certificates)."""
    return trustme.CA()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    """Run the test on each store backend."""
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL for this test (SQLite file per test; PostgreSQL database per run)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'relay.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """A migrated, empty store."""
    engine = create_engine(database_url)
    if engine.dialect.name == "sqlite":
        await migrate.upgrade(engine)
    else:
        async with engine.begin() as conn:
            await conn.execute(text(f"TRUNCATE {', '.join(TABLES)}"))
    yield engine
    await engine.dispose()


ClientFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@asynccontextmanager
async def running_client(
    engine: AsyncEngine,
    sources: dict[str, SourceConfig] | None = None,
    *,
    client_ip: str = "127.0.0.1",
    **options: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking in-process to a receiver app whose lifespan is running."""
    app_options = {key: options.pop(key) for key in ("after_commit", "clock") if key in options}
    config = ReceiverConfig(sources=sources or {"default": SourceConfig(token=TOKEN)}, **options)
    app = create_app(config, engine, **app_options)
    transport = httpx.ASGITransport(app=app, client=(client_ip, 40000))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client,
    ):
        client.app = app  # type: ignore[attr-defined]
        yield client


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated SQLite file of this test's own (for what only SQLite has)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'lane.db'}")
    await migrate.upgrade(engine)
    yield engine
    await engine.dispose()


@pytest.fixture
def make_client(engine: AsyncEngine) -> ClientFactory:
    """``async with make_client(sources, client_ip=..., max_body_bytes=...) as client``."""

    def factory(*args: Any, **kwargs: Any) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        return running_client(engine, *args, **kwargs)

    return factory


@pytest.fixture
async def client(make_client: ClientFactory) -> AsyncIterator[httpx.AsyncClient]:
    """A receiver with the default source protected by ``?token=TOKEN``."""
    async with make_client() as client:
        yield client


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    """A real HTTP sink on 127.0.0.1 that records requests and answers as told."""
    async with serving(Sink()) as running:
        yield running


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """The machine's Redis (database 14 by default), flushed before and after the test."""
    client = Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        service_missing("Redis", exc)
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()


NO_PERSISTENCE = ("--save", "", "--appendonly", "no")


def _start_private_redis(
    binary: str,
    workdir: Path,
    *,
    port: int | None = None,
    options: Sequence[str] = NO_PERSISTENCE,
    password: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """``redis-server`` on a free loopback port (or on ``port``), with ``options``, answering
    PING; a few free ports are tried (another process may take the probed one before the server
    binds it). With a ``password``, the server requires it (``requirepass``) and the URL holds
    it."""
    problems = []
    for attempt in range(3 if port is None else 1):
        chosen = port if port is not None else free_port()
        log = workdir / f"redis-{chosen}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(chosen),
                    "--bind",
                    "127.0.0.1",
                    *options,
                    "--dir",
                    str(workdir),
                    *(["--requirepass", password] if password else []),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        client = redis_sync.Redis(
            host="127.0.0.1", port=chosen, password=password, socket_connect_timeout=0.5
        )
        deadline = time.monotonic() + PRIVATE_REDIS_START_TIMEOUT_S
        try:
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    if client.ping():
                        userinfo = f":{quote(password, safe='')}@" if password else ""
                        return process, f"redis://{userinfo}127.0.0.1:{chosen}/0"
                except (RedisError, OSError):
                    time.sleep(0.05)
        finally:
            client.close()
        state = "exited" if process.poll() is not None else "no PING answer"
        stop_process(process)
        tail = log.read_text(errors="replace")[-1000:]
        problems.append(f"attempt {attempt + 1}, port {chosen}: {state}\n{tail}")
    raise RuntimeError(
        f"redis-server did not answer PING within {PRIVATE_REDIS_START_TIMEOUT_S} s:\n"
        + "\n".join(problems)
    )


@contextmanager
def private_redis(workdir: Path, password: str | None = None) -> Iterator[str]:
    """The URL of a Redis server of the caller's own (``redis-server`` on a free port, nothing
    saved, its files in ``workdir``; requiring ``password`` if given), stopped afterwards.
    Missing ``redis-server``: fails under CI=true, skipped otherwise."""
    binary = shutil.which("redis-server")
    if binary is None:
        service_missing("redis-server (for a private Redis)", FileNotFoundError("redis-server"))
    assert binary is not None
    workdir.mkdir(parents=True, exist_ok=True)
    process, url = _start_private_redis(binary, workdir, password=password)
    try:
        yield url
    finally:
        stop_process(process)


@pytest.fixture
def private_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis server of this test's own, for tests that FLUSHALL: the machine's Redis is
    shared (see :func:`private_redis`)."""
    with private_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url
