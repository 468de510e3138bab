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

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HOST = "127.0.0.1"


class BenchError(Exception):
    """The run could not be carried out (as opposed to a failed check: exit status 2, not 1)."""


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


def interpolate(samples: Sequence[tuple[float, float]], when: float) -> float:
    """The value at ``when`` from ``(time, value)`` samples in time order (say, a process's
    CPU seconds read now and then): linear between the two samples around it, the first or the
    last sample's value outside them."""
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t0 <= when <= t1:
            return v0 + (v1 - v0) * (when - t0) / (t1 - t0) if t1 > t0 else v1
    return samples[0][1] if when < samples[0][0] else samples[-1][1]


# --- the sink --------------------------------------------------------------------------------

Asgi = Callable[[dict[str, Any], Callable[..., Any], Callable[..., Any]], Any]


def _envelope(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def lag(arrival: float, body: bytes, webhook_id: str = "") -> tuple[str, float, float] | None:
    """(event id, ``received_at`` in epoch seconds, ``arrival - received_at``) of one POST: the
    ``webhook-id`` header, else the envelope's ``id``; None when the body is no envelope."""
    envelope = _envelope(body)
    try:
        received = datetime.fromisoformat(envelope["received_at"]).timestamp()
    except (ValueError, KeyError, TypeError):
        return None
    return webhook_id or str(envelope.get("id", "")), received, arrival - received


SINK_MODES = ("ok", "fail", "slow")


def make_sink() -> Asgi:
    """The sink, an ASGI app. A POST elsewhere than ``/_sink/...`` is kept as (arrival
    ``time.time()`` once its body is read, ``webhook-id``, body, status, mode) and answered as
    the mode says: ``ok`` 200 at once, ``fail`` 500 at once, ``slow`` 200 after ``delay``
    seconds (the caller may have given up by then, the sink has the request all the same).

    - ``GET /_sink/records``: ``[[id, received_at, lag_seconds], ...]`` of the POSTs answered
      200 in mode ``ok``, in arrival order (id: ``webhook-id``, else the envelope's);
    - ``GET /_sink/count``: ``{"requests": n, "distinct": d}`` of those;
    - ``GET /_sink/answers``: ``[[id, arrival, status, mode], ...]`` of every POST;
    - ``POST /_sink/mode``: ``{"mode": "ok" | "fail" | "slow", "delay": seconds}``;
    - ``POST /_sink/reset`` forgets every POST; ``GET /_sink/healthz`` answers 200.

    Bodies are parsed only when asked for, so that a delivery costs the sink little."""
    answers: list[tuple[float, str, bytes, int, str]] = []
    seen: set[str] = set()
    state: dict[str, Any] = {"mode": "ok", "delay": 0.0, "ok": 0}

    def ok_rows() -> list[tuple[float, str, bytes, int, str]]:
        return [row for row in answers if row[4] == "ok" and row[3] == 200]

    def control(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if path == "/_sink/records":
            rows = [row for a, w, b, _, _ in ok_rows() if (row := lag(a, b, w))]
            return 200, json.dumps(rows).encode()
        if path == "/_sink/count":
            return 200, json.dumps({"requests": state["ok"], "distinct": len(seen)}).encode()
        if path == "/_sink/answers":
            rows = [[w or _envelope(b).get("id"), a, s, m] for a, w, b, s, m in answers]
            return 200, json.dumps(rows).encode()
        if path == "/_sink/reset" and method == "POST":
            answers.clear()
            seen.clear()
            state["ok"] = 0
        elif path == "/_sink/mode" and method == "POST":
            wanted = _envelope(body)
            if wanted.get("mode") not in SINK_MODES:
                return 400, b"expected {mode: ok|fail|slow, delay: seconds}"
            state.update(mode=wanted["mode"], delay=float(wanted.get("delay", 0.0)))
        return 200, b""

    async def sink(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the sender went away mid-request (a killed worker): nothing arrived
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        arrival, path, status, answer = time.time(), scope["path"], 200, b""
        if path.startswith("/_sink/"):
            status, answer = control(scope["method"], path, body)
        elif scope["method"] == "POST":
            headers = dict(scope.get("headers") or [])
            webhook_id = headers.get(b"webhook-id", b"").decode("latin-1")
            mode = state["mode"]
            status = 500 if mode == "fail" else 200
            answers.append((arrival, webhook_id, body, status, mode))
            if mode == "slow":
                await asyncio.sleep(state["delay"])
            elif mode == "ok":
                state["ok"] += 1
                seen.add(webhook_id or str(len(answers)))
        length = [(b"content-length", str(len(answer)).encode())]  # never chunked
        await send({"type": "http.response.start", "status": status, "headers": length})
        await send({"type": "http.response.body", "body": answer})

    return sink


def sink_argv(port: int) -> list[str]:
    """The command line serving the sink alone on ``port`` (one uvicorn worker)."""
    here = str(Path(__file__).parent)
    return [sys.executable, "-m", "uvicorn", "--factory", "harness:make_sink", "--app-dir", here,
            "--host", HOST, "--port", str(port), "--lifespan", "off", "--no-access-log",
            "--log-level", "warning"]  # fmt: skip


def sink_call(port: int, path: str, method: str = "GET", body: Any = None) -> Any:
    """A control call to the sink (blocking; used between phases only)."""
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", method=method, data=data)
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
    patience: float = 60.0,
) -> Load:
    """Send request ``make(i)`` at ``due[i]`` (``time.monotonic`` seconds) over ``connections``
    keep-alive connections, one request in flight on each. A request due while all are busy
    waits for the first one free, and one more connection is opened for it (up to
    ``max_connections``, as a platform calling a slow endpoint would); its ack latency still
    counts from ``due[i]``. Returns once every request is answered (or ``patience`` seconds after
    the last is due). All due at once: a closed loop over ``connections``."""
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
            await asyncio.wait_for(
                finished, timeout=max(1.0, due[-1] - time.monotonic()) + patience
            )
    except TimeoutError:
        log(f"{remaining[0]} requests unanswered {patience:g} s after the last was due")
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

    def __init__(self, prefix: str = "bench", keep_logs: Path | None = None) -> None:
        self._undo: list[Callable[[], None]] = []
        self.procs: list[Proc] = []  # every process started, in order
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        self._undo.append(lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        if keep_logs is not None:  # copied before the directory goes
            self._undo.append(lambda: copy_logs(self.workdir, keep_logs))

    def __enter__(self) -> Stack:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that __exit__ runs
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with &
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def undo(self, step: Callable[[], Any]) -> None:
        """Run ``step`` on exit (the last registered first)."""
        self._undo.append(step)

    def close(self) -> None:
        log("cleaning up")
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as error:  # clean up the rest anyway
                log(f"cleanup: {error}")

    def start(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
        stdout: Path | None = None,
    ) -> Proc:  # fmt: skip
        """``argv`` in a session of its own, output to a log file (stdout to ``stdout`` when
        given); stopped (group) on exit."""
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as output, (stdout or log_path).open("ab") as out:
            process = subprocess.Popen(
                list(argv), stdout=out, stderr=output, cwd=self.workdir, env=env,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        proc = Proc(name, process, log_path)
        self.procs.append(proc)
        self._undo.append(lambda: stop(proc))
        return proc

    def start_serve(self, config: Path, name: str = "serve", port: int = 0,
                    wrap: Sequence[str] = ()) -> tuple[Proc, int]:  # fmt: skip
        """`relay serve` at warning level without access log; returns once /readyz is 200."""
        port = port or free_port()
        argv = [*relay_command(wrap), "serve", "--config", str(config), "--host", HOST,
                "--port", str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
        proc = self.start(name, argv, relay_env())
        wait_http(proc, port, "/readyz")
        return proc, port

    def start_worker(self, config: Path, name: str = "worker",
                     wrap: Sequence[str] = ()) -> tuple[Proc, int]:  # fmt: skip
        """`relay worker` with a metrics port; returns once its sweeper has swept once
        (``relay_sweeps_total``), i.e. its start-up has run and it takes jobs."""
        port = free_port()
        argv = [*relay_command(wrap), "worker", "--config", str(config), "--metrics-port",
                str(port)]  # fmt: skip
        proc = self.start(name, argv, relay_env())
        wait_http(proc, port, "/metrics", until=lambda text: metric(text, "relay_sweeps_total") > 0)
        return proc, port

    def start_sink(self) -> tuple[Proc, int]:
        port = free_port()
        proc = self.start("sink", sink_argv(port))
        wait_http(proc, port, "/_sink/healthz")
        return proc, port

    def start_redis(self, port: int = 0, appendonly: bool = False) -> tuple[Proc, int]:
        """A private `redis-server` (with ``appendonly``: its file in the work directory, so
        that one started again on ``port`` has the data back)."""
        port = port or free_port()
        aof = "yes" if appendonly else "no"
        argv = ["redis-server", "--port", str(port), "--bind", HOST, "--save", "",
                "--appendonly", aof, "--dir", str(self.workdir)]  # fmt: skip
        proc = self.start(f"redis-{port}", argv)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection((HOST, port), timeout=1).close()
                return proc, port
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start:\n{proc.tail()}")

    def postgres_database(self, admin_url: str, prefix: str = "bench") -> str:
        """A fresh database (dropped on exit); its URL."""
        require_local(admin_url, "PostgreSQL")
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        made = subprocess.run(["psql", admin_url, "-qc", f"CREATE DATABASE {name}"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if made.returncode:
            raise BenchError(f"PostgreSQL at {admin_url} is not usable: {made.stderr.strip()}")
        drop = f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        self._undo.append(lambda: subprocess.run(["psql", admin_url, "-qc", drop], check=False))
        return admin_url.rsplit("/", 1)[0] + "/" + name


def stop(proc: Proc, grace: float = 15.0, first: signal.Signals = signal.SIGTERM) -> int | None:
    """``first`` (SIGTERM) to the process group, SIGKILL after ``grace`` seconds; the exit
    status. SIGINT first lets a process under cProfile write its profile."""
    if proc.process.poll() is not None:
        return proc.process.returncode
    for sig, wait in ((first, grace), (signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            return proc.process.wait(timeout=wait)
        except ProcessLookupError:
            return proc.process.wait()
        except subprocess.TimeoutExpired:
            continue
    return None


def wait_http(
    proc: Proc, port: int, path: str, timeout: float = 60.0,
    until: Callable[[str], bool] = lambda _: True,
) -> None:  # fmt: skip
    """Until GET ``path`` answers 200 with a text ``until`` accepts (or the process dies: its
    log's tail is raised)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.process.poll() is not None:
            raise BenchError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=2) as answer:
                if answer.status == 200 and until(answer.read().decode()):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise BenchError(f"{proc.name} not ready on {path}:\n{proc.tail()}")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus figure's samples (those with ``labels``) in a /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
    return total


def relay_command(wrap: Sequence[str] = ()) -> list[str]:
    """`relay` as this interpreter runs it (``python -m relay``: PYTHONPATH picks the tree);
    ``wrap``: a module that runs it, e.g. ``("cProfile", "-o", "serve.prof")``."""
    return [sys.executable, *(("-m", *wrap) if wrap else ()), "-m", "relay"]


def relay(config: Path | None, *args: str, timeout: float = 300) -> str:
    """One `relay` command with the settings file ``config``; its stdout (BenchError if it
    fails)."""
    argv = [*relay_command(), *args, *(("--config", str(config)) if config else ())]
    done = subprocess.run(argv, capture_output=True, text=True, env=relay_env(),
                          timeout=timeout, check=False)  # fmt: skip
    if done.returncode:
        raise BenchError(f"relay {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def relay_json(config: Path, *args: str) -> Any:
    """A `relay ... --json` command's document."""
    return json.loads(relay(config, *args, "--json"))


def delivery_statuses(config: Path) -> dict[str, int]:
    """Deliveries per status (`relay deliveries list --json`)."""
    rows = relay_json(config, "deliveries", "list", "--limit", "100000")
    return dict(Counter(row["status"] for row in rows))


def settle(config: Path, deadline: float) -> bool:
    """Until no delivery is pending (`relay deliveries list`), or the monotonic ``deadline``."""
    while time.monotonic() < deadline:
        if not relay_json(config, "deliveries", "list", "--status", "pending", "--limit", "1"):
            return True
        time.sleep(0.5)
    return False


def relay_env() -> dict[str, str]:
    """This environment without RELAY_* variables (they would override the settings file)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("RELAY_")}


def copy_logs(workdir: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for path in workdir.glob("*.log"):
        shutil.copy2(path, target / path.name)


def flush_redis(url: str, only_count: bool = False) -> int:
    """FLUSHDB of the Redis database at ``url`` (the run's own; ``only_count``: not); the keys
    it held."""
    import redis  # only the scaled runs need it

    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        keys = int(client.dbsize())
        if not only_count:
            client.flushdb()
        return keys
    except (redis.RedisError, OSError) as exc:
        raise BenchError(f"Redis at {url} is not usable: {exc}") from None
    finally:
        client.close()


# --- settings and command lines --------------------------------------------------------------


def toml_value(value: Any) -> str:
    """A TOML value: strings, numbers, booleans, lists and one level of inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def toml_table(header: str, table: dict[str, Any]) -> str:
    lines = [f"[{header}]", *(f"{key} = {toml_value(value)}" for key, value in table.items())]
    return "\n".join(lines) + "\n"


def write_settings(path: Path, top: dict[str, Any], *tables: str | tuple[str, dict]) -> Path:
    """A settings file: the ``top`` keys, then each table (``(header, dict)`` or TOML text)."""
    parts = ["".join(f"{key} = {toml_value(value)}\n" for key, value in top.items())]
    parts += [t if isinstance(t, str) else toml_table(*t) for t in tables]
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def require_local(url: str, what: str) -> None:
    """Refuse a service that is not on this machine's loopback."""
    if urlsplit(url).hostname not in (HOST, "localhost"):
        raise BenchError(f"{what} must be on {HOST} (got {url!r})")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when installed (as `relay worker --loop auto`), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


@dataclass
class Rows:
    """A report that is a table and checks nothing: JSON, the rows (dataclasses) as a list of
    objects; text, as ``text(rows)`` writes it."""

    rows: list[Any]
    text: Callable[[list[Any]], str]
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(row) for row in self.rows]

    def as_text(self) -> str:
        return self.text(self.rows)


def run_main(name: str, run: Callable[[], Any], as_json: bool) -> int:
    """A bench's ``main``: ``run()`` returns the report (``as_json()``, ``as_text()``,
    ``problems``); exit status 0, 1 when a check failed, 2 when the run failed (BenchError or
    any other error), 130 when interrupted (Ctrl-C, SIGTERM under a :class:`Stack`)."""
    try:
        report = run()
    except BenchError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(f"{name}: the run failed", file=sys.stderr)
        return 2
    print(json.dumps(report.as_json()) if as_json else report.as_text())
    return 1 if report.problems else 0


# --- callback bodies (the simulator's payload factories, a documented API) -------------------


@dataclass(frozen=True)
class Event:
    """One callback: its path below /hooks and its JSON body."""

    path: str
    body: bytes


KINDS = {"/sms/dlr": "sms.dlr", "/sms/inbound": "sms.inbound", "/numinfo/gnp": "numinfo.gnp",
         "/conversations": "conversations.status", "/tts/events": "tts.event"}  # fmt: skip


def kind_mix() -> list[tuple[str, int, Callable[[random.Random], dict[str, Any]]]]:
    """(path below /hooks, weight, factory): a plausible day of platform callbacks."""
    from relay.simulator import factories as f

    return [
        ("/sms/dlr", 30, lambda rng: f.sms_dlr(rng=rng)),
        ("/sms/dlr", 5, lambda rng: f.sms_dlr(status="UNDELIVERABLE", rng=rng)),
        ("/sms/inbound", 15, lambda rng: f.sms_inbound(rng=rng)),
        ("/sms/inbound", 5, lambda rng: f.sms_inbound(parts=2, rng=rng)),
        ("/numinfo/gnp", 15, lambda rng: f.numinfo_gnp(rng=rng)),
        ("/conversations", 15, lambda rng: f.conversations_status(rng=rng)),
        ("/tts/events", 15, lambda rng: f.tts_event(rng=rng)),
    ]


def build_events(count: int, seed: int, paths: Sequence[str] = ()) -> list[Event]:
    """``count`` distinct callbacks mixed across kinds as :func:`kind_mix` weighs them (only
    those at ``paths``, when given)."""
    rng = random.Random(seed)
    mix = [entry for entry in kind_mix() if not paths or entry[0] in paths]
    picks = rng.choices(mix, weights=[weight for _, weight, _ in mix], k=count)
    events = [Event(path, json.dumps(make(rng)).encode()) for path, _, make in picks]
    if len({event.body for event in events}) != count:
        raise BenchError("the factories produced duplicate bodies")
    return events


def hook_post(event: Event, port: int, token: str) -> bytes:
    """A keep-alive POST of ``event`` to the receivers."""
    return post(f"/hooks{event.path}?token={token}", port, event.body)
