"""Ingest benchmark: how fast `relay serve` acknowledges callbacks, next to a no-op baseline.

What is measured, in one run and one target after the other (never simultaneously):

a) the baseline: ``scripts/noop_app.py`` (one catch-all POST route that reads the body and answers
   200 with a small JSON body) under uvicorn, one worker;
b) the real receiver: ``relay serve --no-access-log --log-level warning`` on a fresh SQLite
   database (WAL, synchronous=FULL) in a temp directory, one worker, every callback committed
   durably before its 200.

Both listen on 127.0.0.1 only, with the same uvicorn options (loop and http ``auto``, access log
off, log level warning, no proxy headers, no server header). Each gets the same realistic bodies
from ``relay.simulator.factories`` (a mix of sms.inbound, sms.dlr, numinfo.gnp,
conversations.status and tts.event; every body is a distinct event) at the same paths
(``/hooks/.../?token=...``). The load comes from this process: ``--concurrency`` keep-alive
HTTP/1.1 connections, one request in flight on each, request bytes serialized before the clock
starts, answers parsed as status line + Content-Length (uvloop when installed). ``--warmup``
requests per target are sent first and not counted.

Printed per target: events/s (2xx answers per second of the timed phase) and p50/p99 latency
(send to complete answer, 2xx only); then ratio = receiver events/s / baseline events/s, and the
stored check: after the receiver has stopped, the ids in its ``received_events`` table must be
exactly the ids it acknowledged (warmup included). The exit status is 1 when that check fails,
2 when the run itself fails (a server did not start, ``--timeout`` expired).

Run it with the project's interpreter (needs the project installed)::

    python scripts/bench_ingest.py [--json] [--requests 20000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from relay.simulator import factories

HOST = "127.0.0.1"
SCRIPTS_DIR = Path(__file__).resolve().parent
READY_TIMEOUT_SECONDS = 60.0
STOP_GRACE_SECONDS = 30.0
POLL_INTERVAL_SECONDS = 0.05
LOG_TAIL_CHARS = 3000

Factory = Callable[[random.Random], dict[str, Any]]

# (receiver path below /hooks, weight, factory): a plausible day of platform callbacks.
KIND_MIX: tuple[tuple[str, int, Factory], ...] = (
    ("/sms/dlr", 30, lambda rng: factories.sms_dlr(rng=rng)),
    ("/sms/dlr", 5, lambda rng: factories.sms_dlr(status="UNDELIVERABLE", rng=rng)),
    ("/sms/inbound", 15, lambda rng: factories.sms_inbound(rng=rng)),
    ("/sms/inbound", 5, lambda rng: factories.sms_inbound(parts=2, rng=rng)),
    ("/numinfo/gnp", 15, lambda rng: factories.numinfo_gnp(rng=rng)),
    ("/conversations", 15, lambda rng: factories.conversations_status(rng=rng)),
    ("/tts/events", 15, lambda rng: factories.tts_event(rng=rng)),
)


class BenchError(Exception):
    """The run could not be carried out (as opposed to a failed stored check)."""


# --- payloads and requests -------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One callback: its path below /hooks and its JSON body."""

    path: str
    body: bytes


def build_events(count: int, seed: int) -> list[Event]:
    """``count`` distinct callbacks, mixed across kinds per :data:`KIND_MIX`."""
    rng = random.Random(seed)
    weights = [weight for _, weight, _ in KIND_MIX]
    picks = rng.choices(KIND_MIX, weights=weights, k=count)
    events = [Event(path, json.dumps(make(rng)).encode()) for path, _, make in picks]
    if len({event.body for event in events}) != count:
        raise BenchError("the factories produced duplicate bodies; the stored check needs none")
    return events


def encode_requests(events: Sequence[Event], port: int, token: str) -> list[bytes]:
    """Serialized HTTP/1.1 keep-alive POSTs, one per event."""
    return [
        (
            f"POST /hooks{event.path}?token={token} HTTP/1.1\r\n"
            f"Host: {HOST}:{port}\r\n"
            "User-Agent: bench-ingest\r\n"
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


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


def noop_argv(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "noop_app:app",
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


def relay_command() -> list[str]:
    """The `relay` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("relay")
    if script.exists():
        return [str(script)]
    found = shutil.which("relay")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from relay.cli import main; sys.exit(main())"]


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


def write_config(workdir: Path, token: str) -> Path:
    config = workdir / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{workdir / "bench.db"}"\n\n'
        f'[sources.default]\ntoken = "{token}"\n',
        encoding="utf-8",
    )
    return config


def relay_env() -> dict[str, str]:
    """This environment without RELAY_* variables (they would override the temp config)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("RELAY_")}


# --- one target --------------------------------------------------------------------------------


@dataclass
class TargetResult:
    """What one target did in the timed phase (and which event ids it acknowledged overall)."""

    name: str
    requests: int
    acked: int
    errors: int
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    client_cpu: float  # this process's CPU time / elapsed: near 1.0 would mean it is the limit
    acked_ids: list[str] = field(default_factory=list)
    unreadable_answers: int = 0

    @property
    def eps(self) -> float:
        return self.acked / self.elapsed_s if self.elapsed_s > 0 else 0.0


def percentile_ms(latencies_ns: Sequence[int], fraction: float) -> float:
    """Nearest-rank percentile of sorted latencies, in milliseconds."""
    if not latencies_ns:
        return math.nan
    rank = max(1, math.ceil(fraction * len(latencies_ns)))
    return latencies_ns[rank - 1] / 1e6


def summarize(name: str, warmup: Phase, timed: Phase, *, read_ids: bool) -> TargetResult:
    ok = [i for i, status in enumerate(timed.statuses) if 200 <= status < 300]
    latencies = sorted(timed.latencies_ns[i] for i in ok)
    elapsed = timed.finished_at - timed.started_at
    result = TargetResult(
        name=name,
        requests=len(timed.requests),
        acked=len(ok),
        errors=len(timed.requests) - len(ok),
        elapsed_s=elapsed,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        client_cpu=(timed.cpu_finished_at - timed.cpu_started_at) / elapsed if elapsed else 0.0,
    )
    if read_ids:
        for phase in (warmup, timed):
            for status, body in zip(phase.statuses, phase.bodies, strict=True):
                if 200 <= status < 300:
                    _collect_id(result, body)
    return result


def _collect_id(result: TargetResult, body: bytes) -> None:
    try:
        result.acked_ids.append(str(json.loads(body)["id"]))
    except (ValueError, KeyError, TypeError):
        result.unreadable_answers += 1


async def run_target(
    server: Server,
    ready_path: str,
    warmup: Sequence[bytes],
    timed: Sequence[bytes],
    concurrency: int,
    *,
    read_ids: bool,
) -> TargetResult:
    """Wait for the server, warm it up, then time it; the server is stopped in any case."""
    try:
        await wait_ready(server, ready_path)
        connections = await open_connections(server.port, concurrency)
        try:
            warm = await drive(connections, warmup, keep_bodies=read_ids)
            measured = await drive(connections, timed, keep_bodies=read_ids)
        finally:
            close_connections(connections)
        await asyncio.sleep(0.1)  # let the server see the connections close
    finally:
        status = await asyncio.to_thread(stop_server, server)
    if status not in (0, -signal.SIGTERM):  # uvicorn re-raises SIGTERM once it has shut down
        print(f"warning: {server.name} exited with status {status}", file=sys.stderr)
    return summarize(server.name, warm, measured, read_ids=read_ids)


def stored_ids(database: Path) -> list[str]:
    with sqlite3.connect(database) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM received_events")]


# --- the whole run -------------------------------------------------------------------------------


@dataclass
class Report:
    baseline: TargetResult
    receiver: TargetResult
    stored: int
    stored_ok: bool

    @property
    def ratio(self) -> float:
        return self.receiver.eps / self.baseline.eps if self.baseline.eps else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "baseline_eps": round(self.baseline.eps, 1),
            "eps": round(self.receiver.eps, 1),
            "ratio": round(self.ratio, 3),
            "p50_ms": round(self.receiver.p50_ms, 2),
            "p99_ms": round(self.receiver.p99_ms, 2),
            "stored_ok": self.stored_ok,
            "baseline_p50_ms": round(self.baseline.p50_ms, 2),
            "baseline_p99_ms": round(self.baseline.p99_ms, 2),
            "requests": self.receiver.requests,
            "baseline_errors": self.baseline.errors,
            "errors": self.receiver.errors,
            "acked_distinct": len(set(self.receiver.acked_ids)),
            "stored": self.stored,
            "baseline_client_cpu": round(self.baseline.client_cpu, 2),
            "client_cpu": round(self.receiver.client_cpu, 2),
        }

    def as_text(self) -> str:
        lines = [
            f"{'target':<10} {'events/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
            f"{'client cpu':>10}"
        ]
        for result in (self.baseline, self.receiver):
            lines.append(
                f"{result.name:<10} {result.eps:>10.1f} {result.p50_ms:>8.2f} "
                f"{result.p99_ms:>8.2f} {result.errors:>7} {result.client_cpu:>10.0%}"
            )
        verdict = "ok" if self.stored_ok else "MISMATCH"
        lines.append(f"ratio receiver/baseline: {self.ratio:.3f}")
        lines.append(
            f"stored check: {self.stored} rows, {len(set(self.receiver.acked_ids))} distinct "
            f"acked events (warmup included): {verdict}"
        )
        return "\n".join(lines)


async def bench(args: argparse.Namespace, workdir: Path) -> Report:
    events = build_events(args.warmup + args.requests, args.seed)
    token = secrets.token_urlsafe(24)

    noop_port = free_port()
    noop_requests = encode_requests(events, noop_port, token)
    noop = start_server("baseline", noop_argv(noop_port), noop_port, workdir, dict(os.environ))
    baseline = await run_target(
        noop,
        "/healthz",
        noop_requests[: args.warmup],
        noop_requests[args.warmup :],
        args.concurrency,
        read_ids=False,
    )

    port = free_port()
    requests = encode_requests(events, port, token)
    argv = relay_argv(port, write_config(workdir, token))
    relay = start_server("receiver", argv, port, workdir, relay_env())
    receiver = await run_target(
        relay,
        "/healthz",
        requests[: args.warmup],
        requests[args.warmup :],
        args.concurrency,
        read_ids=True,
    )

    ids = stored_ids(workdir / "bench.db")
    acked = receiver.acked_ids
    stored_ok = (
        receiver.unreadable_answers == 0
        and len(set(acked)) == len(acked)
        and set(ids) == set(acked)
        and len(ids) == len(acked)
    )
    return Report(baseline, receiver, len(ids), stored_ok)


async def bounded(coroutine: Coroutine[Any, Any, Report], seconds: float) -> Report:
    try:
        async with asyncio.timeout(seconds):
            return await coroutine
    except TimeoutError:
        raise BenchError(f"the run took longer than --timeout {seconds:g}s") from None


def run(args: argparse.Namespace, workdir: Path) -> Report:
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(bounded(bench(args, workdir), args.timeout))


def at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=at_least(1), default=20000, help="timed, per target")
    parser.add_argument("--concurrency", type=at_least(1), default=64, help="connections")
    parser.add_argument("--warmup", type=at_least(0), default=1000, help="untimed, per target")
    parser.add_argument("--timeout", type=float, default=900.0, help="overall limit, seconds")
    parser.add_argument("--seed", type=int, default=20260101, help="payload generator seed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        try:
            report = run(args, Path(tmp))
        except BenchError as exc:
            print(f"bench_ingest: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(report.as_json()) if args.json else report.as_text())
    return 0 if report.stored_ok else 1


if __name__ == "__main__":
    sys.exit(main())
