"""Wiring: settings -> database -> receivers app + relay (embedded in process, or real Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime

import httpx
from arq.worker import Worker
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from receivers import create_app
from receivers.config import ReceiverConfig
from receivers.metrics import Metrics
from receivers.store import StoreWritable, create_engine, utc_now
from receivers.store.engine import CONNECT_TIMEOUT_SECONDS, sqlite_file
from receivers.store.writer import HookTiming
from relay.console.access import ConsoleAccess, console_access, mount_console
from relay.destinations.errors import (
    database_address,
    describe_database_error,
    describe_error,
)
from relay.dispatch import Dispatcher
from relay.dispatch.jobs import JobQueue, open_pool
from relay.dispatch.queue_connection import QueueConnection, queue_lost
from relay.dispatch.worker import build_worker, embedded_relay, queue_line
from relay.observe.metrics import (
    EXPOSITION_MAX_AGE_SECONDS,
    StoreFigures,
    WorkerMetrics,
    metrics_server,
)
from relay.outbox import RELAY_WRITES, Due
from relay.outbox.hook import RoutingHook
from relay.outbox.in_commit import routing_writer
from relay.server.default_source import GeneratedToken, served_sources
from relay.server.services import router_for
from relay.settings import Settings, SettingsError
from relay.store import migrate

log = logging.getLogger("relay.serve")  # stable: users filter on it

HOOK_AT_ONCE = HookTiming(delay=0.0, interval=0.0)
"""The hook only hands on the deliveries routed in the events' commit: at once. Scaled, each
call is an arq job, whose start and end (Redis round trips, a claim and a record transaction)
cost the worker about 6 ms of CPU: a job per event at a light load. Making busy calls wait 20 ms
for more events measured worse both at 100 and at 500 callbacks/s (scripts/bench_e2e.py,
alternating runs; docs/performance.md)."""


@dataclass
class Runtime:
    """What a running `relay serve` is made of."""

    settings: Settings
    engine: AsyncEngine
    receiver_config: ReceiverConfig
    generated: GeneratedToken | None
    """The default source's generated token, when the database keeps one."""
    console: ConsoleAccess | None = None
    refused: SettingsError | None = None
    """Why the app's start failed, when a destination can never deliver (`relay serve` reports
    it as any settings error, instead of the server's traceback)."""

    def generated_secrets(self) -> list[str]:
        """The secrets this installation generated and keeps in its database: the default
        source's token, the console's session key and password (those in use)."""
        console = self.console
        generated = [self.generated.token if self.generated is not None else None]
        generated += [console.key, console.generated_password] if console is not None else []
        return [secret for secret in generated if secret is not None]

    def app(self, clock: Callable[[], datetime] = utc_now) -> Starlette:
        """The ASGI app to serve: receivers whose commits are routed and relayed. The relay's
        parts in it (hook, embedded worker, console) share one :class:`StoreWritable`."""
        writable = StoreWritable(RELAY_WRITES)
        hook = RoutingHook(self.engine, router_for(self.settings), clock, writable)
        metrics = Metrics(max_age=EXPOSITION_MAX_AGE_SECONDS)
        store_figures = StoreFigures(
            metrics.registry,
            self.engine,
            self.settings.destinations,
            clock,
            interval=self.settings.metrics_refresh_interval,
        )
        metrics.before_scrape(store_figures.refresh)

        @contextlib.asynccontextmanager
        async def relay() -> AsyncIterator[None]:
            try:
                async with (
                    contextlib.aclosing(store_figures),
                    relay_queue(
                        self.settings,
                        self.engine,
                        clock,
                        registry=metrics.registry,
                        writable=writable,
                    ) as queue,
                ):
                    hook.queue = queue
                    yield
            except SettingsError as refused:
                self.refused = refused
                raise

        app = create_app(
            self.receiver_config,
            self.engine,
            after_commit=hook,
            clock=clock,
            around=relay,
            metrics=metrics,
            in_commit=routing_writer(self.settings.destinations),
            hook_timing=HOOK_AT_ONCE,
        )
        if self.console is not None:

            async def enqueue(due: list[Due]) -> None:
                if hook.queue is not None:
                    await hook.queue.enqueue(due)

            mount_console(
                app,
                self.console,
                self.settings,
                self.engine,
                enqueue,
                clock,
                sources=list(self.receiver_config.sources),
                writable=writable,
            )
        return app


@contextlib.asynccontextmanager
async def relay_queue(
    settings: Settings,
    engine: AsyncEngine,
    clock: Callable[[], datetime],
    *,
    registry: CollectorRegistry | None = None,
    writable: StoreWritable | None = None,
) -> AsyncIterator[Dispatcher]:
    """The relay's dispatcher: arq jobs on real Redis (workers run elsewhere), or, embedded,
    an in-process dispatcher with the worker's services in this event loop, recording in
    ``registry`` (the server's) and telling ``writable`` (the server's state of the relay's
    writes) how its writes went. Its connection's state is ``relay_queue_connected`` in
    ``registry``; a lost Redis is waited out (:mod:`relay.dispatch.queue_connection`)."""
    if settings.redis_url:
        pool = await open_pool(settings.redis_url)
        connection = QueueConnection(pool, registry=registry)
        log.info(queue_line(settings.redis_url))
        try:
            yield JobQueue(pool, clock=clock, connection=connection)
        finally:
            await connection.aclose()
            await pool.aclose()
        return
    async with embedded_relay(
        settings, engine, clock, metrics=WorkerMetrics(registry), writable=writable
    ) as dispatcher:
        yield dispatcher


async def close_worker(worker: Worker) -> None:
    """Stop a worker: cancel its running jobs (their deliveries keep their lease and are
    re-run later), wait for them, then run its shutdown (sweeper, connections).

    arq's own ``close()`` awaits the cancelled jobs without catching their cancellation, which
    would raise and skip the shutdown hook; awaiting them here first avoids that. It also
    deletes its health key in Redis before the shutdown hook: with the queue lost that raises,
    so the hook and the closing of the pool are run here then."""
    for job in worker.tasks.values():
        job.cancel()
    await asyncio.gather(*worker.tasks.values(), return_exceptions=True)
    worker.tasks.clear()  # awaited above; arq's close() would re-raise their cancellation
    try:
        await worker.close()
    except Exception as exc:
        if not queue_lost(exc):
            raise
        if worker.on_shutdown is not None:
            await worker.on_shutdown(worker.ctx)
        await worker.pool.close(close_connection_pool=True)


async def connect_database(engine: AsyncEngine) -> None:
    """Open one connection: a database that is down, unknown or refuses the login is a
    :class:`SettingsError` naming it (without its password), not a traceback. A SQLite file is
    opened with the standard library first: a file that cannot be opened then never reaches the
    async driver, whose thread would report it to an event loop that may be closed by then
    (a traceback of that thread after the one-line error)."""
    where = database_address(engine.url)
    path = sqlite_file(engine)
    try:
        if path is not None:
            sqlite3.connect(path, timeout=CONNECT_TIMEOUT_SECONDS).close()
        async with engine.connect():
            pass
    except sqlite3.Error as exc:
        raise SettingsError(f"cannot connect to the database at {where}: {exc}") from None
    except (OSError, TimeoutError, DBAPIError) as exc:
        raise SettingsError(
            f"cannot connect to the database at {where}: {describe_database_error(exc)}"
        ) from None


async def prepare_database(engine: AsyncEngine) -> None:
    """Check the connection; SQLite is migrated in place, other databases must have been
    upgraded by an operator."""
    await connect_database(engine)
    if engine.dialect.name == "sqlite":
        await migrate.upgrade(engine)
        return
    await require_current_schema(engine)


async def require_current_schema(engine: AsyncEngine) -> None:
    """A :class:`SettingsError` unless the database's schema is the one this version needs."""
    current, head = await migrate.current_revision(engine), migrate.head_revision()
    if current is not None and not migrate.is_known(current):
        raise migrate.unknown_revision(current)
    if current != head:
        raise SettingsError(
            f"the database schema is at revision {current or 'none'}, this version needs {head}: "
            "run `relay db upgrade` first"
        )


CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")
"""Where OpenSSL, and so every HTTPS destination, looks for trusted CA certificates."""


def check_trusted_certificates() -> None:
    """A :class:`SettingsError` naming ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when the trusted CA
    certificates cannot be loaded (a missing or wrong file): checked before a server or worker
    starts, where it would be an error of whatever happened to build the first HTTP client."""
    try:
        httpx.create_ssl_context()
    except OSError as exc:  # ssl.SSLError is one
        named = [f"{name}={os.environ[name]}" for name in CA_VARIABLES if os.environ.get(name)]
        where = f" ({', '.join(named)})" if named else ""
        raise SettingsError(
            f"cannot load the trusted CA certificates{where}: {describe_error(exc)}"
        ) from None


async def start(settings: Settings) -> Runtime:
    """Open the database, bring it up to date, check Redis (scaled mode) and resolve the
    sources. A service that cannot be reached is a :class:`SettingsError` raised here, before
    the server starts (not a failed start-up inside it)."""
    check_trusted_certificates()
    engine = create_engine(settings.database_url)
    try:
        await prepare_database(engine)
        if settings.redis_url:
            await (await open_pool(settings.redis_url)).aclose()
        served = await served_sources(settings.sources, engine)
        config = ReceiverConfig(
            sources=served.sources,
            max_body_bytes=settings.max_body_bytes,
            trusted_proxies=tuple(settings.trusted_proxies),
            writer_process=settings.writer_process,
        )
        console = await console_access(settings, engine)
    except BaseException:
        await engine.dispose()
        raise
    return Runtime(settings, engine, config, served.generated, console)


async def run_worker(
    settings: Settings,
    clock: Callable[[], datetime] = utc_now,
    *,
    metrics_host: str = "127.0.0.1",
    metrics_port: int | None = None,
) -> None:
    """`relay worker`: the relay worker and its sweeper on the configured Redis, until stopped;
    with a ``metrics_port``, its figures are served at ``http://metrics_host:port/metrics``."""
    if not settings.redis_url:
        raise SettingsError(
            "relay worker needs redis_url (RELAY_REDIS_URL); without it, `relay serve` runs "
            "the worker in its own process"
        )
    check_trusted_certificates()
    engine = create_engine(settings.database_url)
    try:
        await prepare_database(engine)
        pool = await open_pool(settings.redis_url)
        metrics = WorkerMetrics()
        worker = build_worker(settings, engine, pool, clock=clock, metrics=metrics)
        try:
            async with metrics_server(metrics.registry, metrics_host, metrics_port):
                await worker.async_run()
        except asyncio.CancelledError:
            pass  # SIGINT/SIGTERM: arq cancels its main task and its jobs
        finally:
            await close_worker(worker)
    finally:
        await engine.dispose()
