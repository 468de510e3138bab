"""What is left of the older shared pieces, for the in-process and closed-loop benches
(``bench_ingest.py``, ``bench_scrapers.py``, ``bench_console.py``, ``bench_line.py``,
``bench_prune.py``, ``store_cost.py``); everything shared with the end-to-end benches lives in
:mod:`harness` and is re-exported here under the same names.

- serialized keep-alive POSTs (:func:`encode_requests`) and a closed-loop load generator:
  connections driven by asyncio protocol callbacks, one request in flight on each
  (:func:`open_connections`, :func:`drive`);
- server subprocesses (:func:`start_server`, :func:`wait_ready`, :func:`stop_server`),
  `relay serve` and uvicorn command lines (:func:`relay_argv`, :func:`uvicorn_argv`,
  :func:`guarded_uvicorn_argv`, the latter over an internal of the package);
- a migrated store of a run's own, in process (:func:`fresh_store`, internals by design: those
  benches time the store itself), :func:`admin_execute`, :func:`bounded`,
  :func:`sigterm_interrupts`, :func:`percentile_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import asyncpg
from harness import HOST as HOST  # the shared pieces, under this module's names
from harness import BenchError as BenchError
from harness import Event as Event
from harness import at_least as at_least
from harness import build_events as build_events
from harness import free_port as free_port
from harness import kind_mix
from harness import loop_factory as loop_factory
from harness import process_cpu_seconds as process_cpu_seconds
from harness import relay_command as relay_command
from harness import relay_env as relay_env
from harness import require_local as require_local
from sqlalchemy.ext.asyncio import AsyncEngine

SCRIPTS_DIR = Path(__file__).resolve().parent
READY_TIMEOUT_SECONDS = 60.0
STOP_GRACE_SECONDS = 30.0
POLL_INTERVAL_SECONDS = 0.05
LOG_TAIL_CHARS = 3000
KIND_MIX = tuple(kind_mix())  # (receiver path below /hooks, weight, factory)

# --- payloads and requests -------------------------------------------------------------------


def encode_requests(
    events: Sequence[Event], port: int, token: str, *, user_agent: str = "bench-ingest"
) -> list[bytes]:
    """Serialized HTTP/1.1 keep-alive POSTs, one per event."""
    return [
        (
            f"POST /hooks{event.path}?token={token} HTTP/1.1\r\n"
            f"Host: {HOST}:{port}\r\n"
            f"User-Agent: {user_agent}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(event.body)}\r\n\r\n"
        ).encode()
        + event.body
        for event in events
    ]


# --- the load generator ----------------------------------------------------------------------


class Phase:
    """A list of requests shared by all connections; records each answer by request index."""

    def __init__(self, requests: Sequence[bytes], *, keep_bodies: bool) -> None:
        self.requests = requests
        self.keep_bodies = keep_bodies
        self.statuses = [0] * len(requests)
        self.latencies_ns = [0] * len(requests)
        self.bodies: list[bytes] = [b""] * len(requests) if keep_bodies else []
        self.started_at = 0.0
        self.finished_at = 0.0
        self.cpu_started_at = 0.0
        self.cpu_finished_at = 0.0
        self.failure: str | None = None
        self._next = 0
        self._active = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def take(self) -> int | None:
        """The next request index, or None when all have been handed out."""
        index = self._next
        if index >= len(self.requests):
            return None
        self._next = index + 1
        return index

    def record(self, index: int, status: int, latency_ns: int, body: bytes) -> None:
        self.statuses[index] = status
        self.latencies_ns[index] = latency_ns
        if self.keep_bodies:
            self.bodies[index] = body

    def join(self) -> None:
        self._active += 1

    def leave(self) -> None:
        self._active -= 1
        if self._active == 0:
            self.finish()

    def finish(self) -> None:
        if not self.done.done():
            self.finished_at = time.perf_counter()
            self.cpu_finished_at = time.process_time()
            self.done.set_result(None)

    @property
    def active(self) -> int:
        return self._active


class Connection(asyncio.Protocol):
    """One keep-alive connection with one request in flight, driven by callbacks."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.phase: Phase | None = None
        self.index = -1
        self.sent_ns = 0
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def start(self, phase: Phase) -> None:
        """Take part in ``phase`` until its requests run out."""
        if self.lost:
            return
        self.phase = phase
        phase.join()
        self._send_next()

    def _send_next(self) -> None:
        phase = self.phase
        assert phase is not None and self.transport is not None
        index = phase.take()
        if index is None:
            self.phase, self.index = None, -1
            phase.leave()
            return
        self.index = index
        self.sent_ns = time.perf_counter_ns()
        self.transport.write(phase.requests[index])

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        try:
            status = int(self.buffer[9:12])
            total = end + 4 + _content_length(bytes(self.buffer[:end]))
        except (BenchError, ValueError) as exc:
            if self.phase is not None:
                self.phase.failure = f"unreadable answer: {exc}"
            assert self.transport is not None
            self.transport.close()  # connection_lost ends this connection's part
            return
        if len(self.buffer) < total:
            return
        body = bytes(self.buffer[end + 4 : total])
        del self.buffer[:total]
        if self.phase is None:
            return
        self.phase.record(self.index, status, time.perf_counter_ns() - self.sent_ns, body)
        self._send_next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.phase is not None:
            phase, self.phase = self.phase, None
            phase.record(self.index, 0, 0, b"")
            phase.leave()


def _content_length(head: bytes) -> int:
    for line in head.lower().split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name == b"content-length":
            return int(value)
    raise BenchError("an answer without Content-Length (chunked answers are not expected)")


async def open_connections(port: int, count: int) -> list[Connection]:
    loop = asyncio.get_running_loop()
    pairs = await asyncio.gather(
        *(loop.create_connection(Connection, HOST, port) for _ in range(count))
    )
    return [protocol for _, protocol in pairs]


def close_connections(connections: Sequence[Connection]) -> None:
    for connection in connections:
        if connection.transport is not None:
            connection.transport.close()


async def drive(
    connections: Sequence[Connection], requests: Sequence[bytes], *, keep_bodies: bool
) -> Phase:
    """Send every request over the connections; returns once all are answered (or lost)."""
    phase = Phase(requests, keep_bodies=keep_bodies)
    phase.started_at = time.perf_counter()
    phase.cpu_started_at = time.process_time()
    for connection in connections:
        connection.start(phase)
    if phase.active == 0:  # no connection could take part
        phase.finish()
    await phase.done
    if phase.failure is not None:
        raise BenchError(phase.failure)
    if any(status == 0 for status in phase.statuses):
        raise BenchError("connections were lost before every request was answered")
    return phase


# --- servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    """A server subprocess and where its output goes."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""


def start_server(
    name: str, argv: Sequence[str], port: int, workdir: Path, env: dict[str, str]
) -> Server:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return Server(name, process, port, log_path)


def stop_server(server: Server) -> int:
    """SIGTERM, then wait (SIGKILL after the grace period); returns the exit status."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            return server.process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            server.process.kill()
    return server.process.wait()


async def http_status(port: int, path: str) -> int | None:
    """The status of a GET, or None when nothing answers yet."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return None
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        line = await reader.readline()
        return int(line.split()[1]) if line.startswith(b"HTTP/") else None
    except (OSError, ValueError, IndexError):
        return None
    finally:
        writer.close()


async def wait_ready(server: Server, path: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise BenchError(f"{server.name} exited early:\n{server.log_tail()}")
        if await http_status(server.port, path) == 200:
            return
        await asyncio.sleep(POLL_INTERVAL_SECONDS)
    raise BenchError(f"{server.name} did not answer {path} in time:\n{server.log_tail()}")


def uvicorn_argv(app: str, port: int) -> list[str]:
    """One uvicorn worker serving ``module:attribute`` from this directory, with the options
    `relay serve` gives uvicorn (access log off, log level warning)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--app-dir",
        str(SCRIPTS_DIR),
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        "1",
        "--loop",
        "auto",
        "--http",
        "auto",
        "--no-access-log",
        "--log-level",
        "warning",
        "--no-proxy-headers",  # as `relay serve` configures uvicorn
        "--no-server-header",
        "--lifespan",
        "on",
    ]


GUARDED_SERVER = """
import sys
import uvicorn
from uvicorn.importer import import_from_string
from relay.server.serve import server_config
from relay.settings import Settings
app_dir, app_path, host, port = sys.argv[1:]
sys.path.insert(0, app_dir)
app = import_from_string(app_path)
config = server_config(app, Settings(), host, int(port), "warning", access_log=False)
uvicorn.Server(config).run()
"""


def guarded_uvicorn_argv(app: str, port: int) -> list[str]:
    """One uvicorn worker serving ``module:attribute`` from this directory exactly as `relay
    serve` runs its receivers (``relay.server.serve.server_config``: httptools behind the connection
    guard, default limits, access log off, log level warning); loop and lifespan as
    :func:`uvicorn_argv`."""
    return [sys.executable, "-c", GUARDED_SERVER, str(SCRIPTS_DIR), app, HOST, str(port)]


def relay_argv(port: int, config: Path) -> list[str]:
    command = relay_command()
    help_text = subprocess.run(
        [*command, "serve", "--help"], capture_output=True, text=True, check=False, timeout=60
    ).stdout
    # At log level warning uvicorn drops its (info) access lines anyway; the flag makes it explicit.
    access = ["--no-access-log"] if "--no-access-log" in help_text else []
    if not access:
        print("note: this `relay serve` has no --no-access-log flag", file=sys.stderr)
    return [
        *command,
        "serve",
        "--config",
        str(config),
        "--host",
        HOST,
        "--port",
        str(port),
        *access,
        "--log-level",
        "warning",
    ]


def percentile_ms(latencies_ns: Sequence[int], fraction: float) -> float:
    """Nearest-rank percentile of sorted latencies, in milliseconds."""
    if not latencies_ns:
        return math.nan
    rank = max(1, math.ceil(fraction * len(latencies_ns)))
    return latencies_ns[rank - 1] / 1e6


T = TypeVar("T")


async def bounded(coroutine: Coroutine[Any, Any, T], deadline: float) -> T:
    """Await ``coroutine``, failing the run once the monotonic ``deadline`` has passed."""
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
            return await coroutine
    except TimeoutError:
        raise BenchError("the run took longer than --timeout") from None


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the run like Ctrl-C does, so that the clean-up still runs."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


async def admin_execute(dsn: str, sql: str) -> None:
    """Run one statement on PostgreSQL (CREATE/DROP DATABASE for a run's own database)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def fresh_store(backend: str, admin_dsn: str, prefix: str) -> AsyncIterator[AsyncEngine]:
    """A migrated, empty store of a run's own: a SQLite file in a temporary directory, or a
    PostgreSQL database ``<prefix>_<random>`` made through ``admin_dsn``, dropped at the end."""
    from receivers.store import create_engine
    from relay.store import migrate

    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix=f"{prefix}-") as directory:
            engine = create_engine(f"sqlite:///{Path(directory) / 'relay.db'}")
            try:
                await migrate.upgrade(engine)
                yield engine
            finally:
                await engine.dispose()
        return
    name = f"{prefix}_{os.urandom(4).hex()}"
    await admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    base = admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    engine = create_engine(f"{base}/{name}")
    try:
        await migrate.upgrade(engine)
        yield engine
    finally:
        await engine.dispose()
        await admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
