"""Shared pieces of the end-to-end benches, over the product's public entry points only: the
`relay` command line as subprocesses, its TOML settings file, and HTTP.

- :class:`Stack`: processes, temporary directories and PostgreSQL databases, all removed on exit
  (``with Stack() as stack:``), even after Ctrl-C or SIGTERM;
- the recording sink (:func:`make_sink`, an ASGI app, run in its own process by
  :meth:`Stack.start_sink`): per POST, the arrival (``time.time()``) minus the envelope's
  ``received_at``, that is the lag;
- an open-loop load generator (:func:`schedule`, :func:`open_loop`): request ``i`` is due at
  ``start + i / rate`` whatever the answers before it did, its ack latency counted from then;
- unique SMS delivery reports (:func:`dlr_body`) and small helpers (:func:`percentile`,
  :func:`cpu_seconds`).

``python -m uvicorn --factory harness:make_sink --app-dir scripts`` serves the sink alone.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


def log(message: str) -> None:
    """One progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (sorted or not); NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def iso_now() -> str:
    """Now, as the envelope writes ``received_at`` (UTC, microseconds, ``Z``; fixed length)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def dlr_body(index: int) -> bytes:
    """A unique sms.dlr delivery report (a current one: ``requestId``), in the platform's shape."""
    request_id = str(uuid.uuid4())
    done = f"2026-01-01T00:00:{index % 60:02d}.000Z"
    report = {
        "requestId": request_id,
        "status": "DELIVERED",
        "reference": f"order-{index}",
        "from": "ACME",
        "to": f"+49151{index % 10**8:08d}",
        "href": f"https://api.example.com/messaging/v1/messages/{request_id}",
        "submitDate": done,
        "sentDate": done,
        "doneDate": done,
        "errorCode": "000",
        "errorReason": "Delivered",
        "mccmnc": "26201",
        "ttid": 26201,
        "size": 1,
        "overallPrice": "0.0450",
        "priceEffective": "2026-01-01T00:00:00.000Z",
        "parts": [{"partId": str(uuid.uuid4()), "deliveryState": "DELIVERED", "doneDate": done,
                   "errorCode": "000", "price": "0.0450", "currency": "EUR",
                   "priceEffective": "2026-01-01T00:00:00.000Z", "statusText": "Delivered"}],
    }  # fmt: skip
    return json.dumps(report, separators=(",", ":")).encode()


def post(path: str, port: int, body: bytes) -> bytes:
    """A keep-alive HTTP/1.1 POST of JSON ``body``, serialized."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# --- CPU from /proc --------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants (a server's writer process is its child)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process; NaN once it is gone."""
    return cpu_seconds([pid]).get(pid, math.nan)


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of each live pid."""
    tick = os.sysconf("SC_CLK_TCK")
    return {
        pid: (int(fields[11]) + int(fields[12])) / tick for pid in pids if (fields := _stat(pid))
    }


# --- the sink --------------------------------------------------------------------------------

Asgi = Callable[[dict[str, Any], Callable[..., Any], Callable[..., Any]], Any]


def lag(arrival: float, body: bytes) -> tuple[str, float, float] | None:
    """(envelope id, ``received_at`` in epoch seconds, ``arrival - received_at``) of one POST."""
    try:
        envelope = json.loads(body)
        received = datetime.fromisoformat(envelope["received_at"]).timestamp()
    except (ValueError, KeyError, TypeError):
        return None
    return str(envelope.get("id", "")), received, arrival - received


def make_sink() -> Asgi:
    """The sink, an ASGI app: any POST is kept as (arrival ``time.time()``, body) and answered
    200; ``GET /_sink/records`` answers ``[[id, received_at, lag_seconds], ...]`` in arrival
    order, ``GET /_sink/count`` their number, ``POST /_sink/reset`` forgets them. Bodies are
    parsed only when the records are asked for, so that a delivery costs the sink little."""
    records: list[tuple[float, bytes]] = []

    async def sink(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        arrival, answer = time.time(), b""
        if scope["path"] == "/_sink/records":
            answer = json.dumps([row for a, b in records if (row := lag(a, b))]).encode()
        elif scope["path"] == "/_sink/count":
            answer = str(len(records)).encode()
        elif scope["path"] == "/_sink/reset":
            records.clear()
        elif scope["method"] == "POST":
            records.append((arrival, body))
        length = [(b"content-length", str(len(answer)).encode())]  # never chunked
        await send({"type": "http.response.start", "status": 200, "headers": length})
        await send({"type": "http.response.body", "body": answer})

    return sink


def sink_call(port: int, path: str, method: str = "GET") -> Any:
    """A control call to the sink (blocking; used between phases only)."""
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", method=method, data=b"")
    with urllib.request.urlopen(request, timeout=60) as answer:
        data = answer.read()
    return json.loads(data) if data else None


# --- the open-loop load generator ------------------------------------------------------------


def schedule(start: float, rate: float, count: int) -> list[float]:
    """When each request is due: fixed by the rate alone, never by the answers (open loop)."""
    return [start + index / rate for index in range(count)]


@dataclass
class Load:
    """One paced phase: per request its due time, send time, answer time and status."""

    due: list[float]
    sent: list[float] = field(default_factory=list)
    acked: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)
    waited: int = 0  # requests that found every connection busy at their due time
    connections: int = 0  # connections used, those opened for waiting requests included

    def __post_init__(self) -> None:
        count = len(self.due)
        self.sent, self.acked = [math.nan] * count, [math.nan] * count
        self.status, self.answers = [0] * count, [b""] * count

    def ack_ms(self) -> list[float]:
        """Ack latency from the due time (so a queue in front of the server counts)."""
        return [
            (a - d) * 1000
            for d, a, s in zip(self.due, self.acked, self.status, strict=True)
            if s // 100 == 2
        ]


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request in flight; calls ``done`` with each answer."""

    def __init__(self, done: Callable[[_Connection, int, bytes], None]) -> None:
        self.done, self.buffer, self.transport = done, b"", None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode("latin-1").split("\r\n")
        length = next(
            (int(h.split(":", 1)[1]) for h in head if h.lower().startswith("content-length:")), 0
        )
        if len(self.buffer) < end + 4 + length:
            return
        body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
        self.done(self, int(head[0].split()[1]), body)


async def open_loop(
    port: int,
    make: Callable[[int], bytes],
    due: Sequence[float],
    connections: int,
    max_connections: int = 0,
) -> Load:
    """Send request ``make(i)`` at ``due[i]`` (``time.monotonic`` seconds) over ``connections``
    keep-alive connections, one request in flight on each. A request due while all are busy
    waits for the first one free, and one more connection is opened for it (up to
    ``max_connections``, as a platform calling a slow endpoint would); its ack latency still
    counts from ``due[i]``. Returns once every request is answered (or 60 s after the last is
    due)."""
    loop = asyncio.get_running_loop()
    load = Load(list(due))
    idle: deque[_Connection] = deque()
    waiting: deque[int] = deque()
    in_flight: dict[_Connection, int] = {}
    everyone: list[_Connection] = []
    opening: set[asyncio.Task[None]] = set()
    finished = loop.create_future()
    remaining = [len(due)]

    def send(connection: _Connection, index: int) -> None:
        in_flight[connection] = index
        load.sent[index] = time.monotonic()
        connection.transport.write(make(index))  # type: ignore[union-attr]

    def free(connection: _Connection) -> None:
        if waiting:
            send(connection, waiting.popleft())
        else:
            idle.append(connection)

    def done(connection: _Connection, status: int, body: bytes) -> None:
        index = in_flight.pop(connection)
        load.acked[index], load.status[index], load.answers[index] = time.monotonic(), status, body
        remaining[0] -= 1
        free(connection)
        if not remaining[0] and not finished.done():
            finished.set_result(None)

    async def connect() -> None:
        _, connection = await loop.create_connection(lambda: _Connection(done), HOST, port)
        everyone.append(connection)
        free(connection)

    await asyncio.gather(*(connect() for _ in range(connections)))
    try:
        for index, when in enumerate(due):
            if (delay := when - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            if idle:
                send(idle.popleft(), index)
                continue
            load.waited += 1
            waiting.append(index)
            if len(everyone) + len(opening) < max_connections and len(waiting) > len(opening):
                task = asyncio.create_task(connect())
                opening.add(task)
                task.add_done_callback(opening.discard)
        if due:
            await asyncio.wait_for(finished, timeout=max(1.0, due[-1] - time.monotonic()) + 60)
    except TimeoutError:
        log(f"{remaining[0]} requests unanswered 60 s after the last was due")
    finally:
        load.connections = len(everyone)
        for connection in everyone:
            connection.transport.close()  # type: ignore[union-attr]
    return load


# --- machine CPU -----------------------------------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, summed over its cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - fields[3] - fields[4]) / tick, sum(fields) / tick


# --- processes, stores and their cleanup -----------------------------------------------------


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


class Stack:
    """What a bench started, stopped and removed in reverse order on exit."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
        self._undo.append(lambda: shutil.rmtree(self.workdir, ignore_errors=True))

    def __enter__(self) -> Stack:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that __exit__ runs
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with &
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        log("cleaning up")
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as error:  # clean up the rest anyway
                log(f"cleanup: {error}")

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        """``argv`` in a session of its own, output to a log file; stopped (group) on exit."""
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as output:
            process = subprocess.Popen(
                list(argv), stdout=output, stderr=subprocess.STDOUT, cwd=self.workdir,
                env=env, start_new_session=True,
            )  # fmt: skip
        proc = Proc(name, process, log_path)
        self._undo.append(lambda: stop(proc))
        return proc

    def start_sink(self) -> tuple[Proc, int]:
        port = free_port()
        here = str(Path(__file__).parent)
        argv = [sys.executable, "-m", "uvicorn", "--factory", "harness:make_sink", "--app-dir",
                here, "--host", HOST, "--port", str(port), "--lifespan", "off", "--no-access-log",
                "--log-level", "warning"]  # fmt: skip
        proc = self.start("sink", argv)
        wait_http(proc, port, "/_sink/records")
        return proc, port

    def start_redis(self) -> tuple[Proc, int]:
        port = free_port()
        argv = ["redis-server", "--port", str(port), "--bind", HOST, "--save", "",
                "--appendonly", "no"]  # fmt: skip
        proc = self.start(f"redis-{port}", argv)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return proc, port
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start:\n{proc.tail()}")

    def postgres_database(self, admin_url: str) -> str:
        """A fresh database (dropped on exit); its URL."""
        name = f"bench_e2e_{uuid.uuid4().hex[:12]}"
        subprocess.run(["psql", admin_url, "-qc", f"CREATE DATABASE {name}"], check=True)
        drop = f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        self._undo.append(lambda: subprocess.run(["psql", admin_url, "-qc", drop], check=False))
        return admin_url.rsplit("/", 1)[0] + "/" + name


def stop(proc: Proc, grace: float = 15.0) -> None:
    """SIGTERM to the process group, SIGKILL after ``grace`` seconds."""
    if proc.process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def wait_http(proc: Proc, port: int, path: str, timeout: float = 60.0) -> None:
    """Until GET ``path`` answers 200 (or the process dies: its log's tail is raised)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready on {path}:\n{proc.tail()}")


def relay_command() -> list[str]:
    """`relay` as this interpreter runs it (``python -m relay``: PYTHONPATH picks the tree)."""
    return [sys.executable, "-m", "relay"]


def relay_env() -> dict[str, str]:
    """This environment without RELAY_* variables (they would override the settings file)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("RELAY_")}
