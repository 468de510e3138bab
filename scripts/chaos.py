"""Fault-injection run: the scaled deployment under faults, then the sink reconciled with the store.

What runs (everything on 127.0.0.1): a fresh PostgreSQL database ``chaos_<random>`` (created
through the admin DSN ``--pg-admin-dsn``, migrated with ``relay db upgrade``, dropped at the end),
two ``relay serve`` processes on two ports and two ``relay worker`` processes sharing it and one
Redis database (``--redis-url``, default ``redis://127.0.0.1:6379/11``), and the recording sink
``scripts/sink_app.py`` as the one HTTP destination: envelope format, ``timeout = "1s"``, the
custom policy ``chaos`` (retries 1 s and 2 s after a failure, then every 2 s, give up after
10 min), ``lease_margin = "2s"``, ``sweep_interval = "1s"``.

The load: ``--events`` callbacks played by the simulator (``relay.simulator``: every scenario in
turn, each instance in causal order), the scenario instances alternating between the two serve
processes, one ``Platform`` each with the platform's own retry policies on a ``ScaledClock``
(``--time-scale``; the default 0.1 spreads the three attempts of ``platform-status``, the
shortest schedule, over 15 s): a callback that meets a serve process while it is down is retried
until it is accepted. At most ``--events / --ingest-seconds`` callbacks are started per second,
so that the faults below fall into the traffic also in short runs.

What is injected, in this order, when the given share of the callbacks has been sent (each fault
is printed with its time since the traffic started and its wall-clock time):

1. 10 %: the sink answers every POST with HTTP 500 for ``--fault-seconds``, then recovers;
2. 25 %: worker-1 is SIGKILLed and started again ``--restart-delay`` seconds later;
3. 40 %: serve-2 is restarted (SIGTERM, wait for the exit, start again on the same port; the
   platform's retries cover the gap);
4. 55 %: Redis flushed: FLUSHDB of the run's database (``--flush db``, the default), or
   FLUSHALL, every database of the server, as a lost Redis would be (``--flush all``: only on a
   Redis of the run's own, never on one that others use); or, with ``--redis-outage sigterm``
   or ``sigkill``, Redis stopped with that signal and started again on the same port
   ``--fault-seconds`` later (the run's own ``redis-server`` on a free port, with an
   append-only file in the work directory: ``--redis-url`` is not used then);
5. 70 %: the sink answers only after ``--slow-seconds`` (2 s, longer than the destination's 1 s
   timeout) for ``--fault-seconds``: the relay sees time-outs, the sink has the events anyway;
6. 85 %: worker-2 is SIGKILLed and started again.

At the end it waits (bounded by ``--timeout``) until every received event is routed and every
delivery is succeeded or dead, then reconciles the sink's log (every POST with its webhook-id,
arrival time and answer) with PostgreSQL (``received_events``, ``deliveries``) and prints:

- accepted: rows in ``received_events`` (checked against the ids the receivers acknowledged to
  the platform, and against the number of distinct callbacks the simulator sent);
- delivered: distinct event ids the sink answered 2xx in time;
- lost: accepted, never delivered and not dead (must be 0);
- duplicates: 2xx answers beyond the first per event id (at least once), explained: after a
  time-out (the relay never saw the answer), across a worker kill (sent, not yet recorded), or
  unexplained (worth a look);
- dead: deliveries given up by the policy;
- max lag: seconds from ``received_at`` to the first in-time 2xx arrival at the sink;
- out_of_order: per order key (``deliveries.order_key`` when set, else
  ``received_events.platform_id``; events with neither are not counted), the events taken in the
  order they arrived at the receivers (``received_at``, then the id, as the relay orders its
  lines): the events whose first in-time 2xx arrival at the sink came before the first in-time
  2xx arrival of an earlier event of the same key. Dead deliveries are left out (a dead one lets
  the next of its key go, by design), as are lost ones;
- late_repeats (informative): 2xx arrivals of an event, other than its first in-time one, after
  the first in-time 2xx of a later event of its key;
- ordered_keys: keys with two events or more (``ordered_events``: their events), i.e. how much
  the ordering check had to compare. The simulator plays each scenario instance in causal order
  (an SMS's ACCEPTED, BUFFERED then DELIVERED reports with one requestId; a call's events with
  one callId), the next callback only once the previous one was accepted, so the keys of the
  multi-step scenarios have 2 to 4 events each.

``--ordering per-key`` sets ``ordering = "per-key"`` on the sink's destination table (the
default order key, ``{platform_id}``): the relay then delivers the events of one key one at a
time, in arrival order, and ``out_of_order > 0`` fails the run. With the default
``--ordering none`` the events of one key go in parallel and ``out_of_order`` is informative.
A late repeat is no ordering failure: a copy of an earlier event, sent before its success was
recorded, that reached the sink after a later event of its key. Without ordering any duplicate
(after a time-out, across a kill) can do that, as the later event does not wait. With per-key
ordering the next event of a key is sent only once the earlier one's success is recorded, which
takes an in-time 2xx, so a copy of the earlier one must still have been on its way then: the
request of an attempt whose lease expired while it was in flight (a stalled or starved worker,
"lease expired during attempt" in the logs), the event meanwhile delivered by another worker. A
time-out or a kill does not do it here: the sink records a request only once it has read its
body while the connection is still open, i.e. before the relay gave up on it (the slow mode
reads the request at once and only answers late), and only a later attempt's success lets the
next event go.

Throughput (the faults slow it down; see ``--no-faults``): ``events_per_s`` = accepted events /
(last first-in-time delivery arriving at the sink - first callback sent), i.e. end to end through
ingest, routing, queueing and delivery; ``ingest_per_s`` = accepted events / the platform's
traffic time (first callback sent to the last answer, retries included).

``--json`` prints one JSON object (``accepted``, ``delivered``, ``lost``, ``duplicates``,
``dead``, ``max_lag_s``, ``out_of_order``, ``late_repeats``, ``ordered_keys``, ``faults``,
``duration_s``, ``events_per_s``, ``ingest_per_s`` and more; ``out_of_order_samples``: the first
out-of-order events with every event of their key, its delivery attempts and its arrivals). The
exit status is 1 when anything was lost or a check failed (a callback given up by the platform,
acknowledged ids missing from the store, deliveries still pending at the deadline, with
``--ordering per-key`` an event out of order), 2
when the run itself failed (a process did not start or exited on its own, ``--timeout``
expired). Every process, the
database, the Redis database and the temp directory are cleaned up on every path, Ctrl-C and
SIGTERM included.

Other shapes of the deployment: ``--servers N`` / ``--workers M`` (default 2 and 2; the faults
need at least 2 of each). ``--no-faults`` injects nothing (the sink always answers 200 at once)
and, unless ``--ingest-seconds`` / ``--time-scale`` are given, sends the callbacks as fast as
``--concurrency`` allows (no rate limit; the platform's retry delays shrunk to 1/1000): a
throughput run of the same deployment, with the same reconciliation. The report also gives the
cores each role kept busy (``cpu_cores``; ``rest`` is PostgreSQL, Redis and anything else).

``--destination amqp|nats|mqtt`` runs the same plan against a message broker instead of the
HTTP sink (``broker_bench.BrokerOutage``): a private ``nats-server -js`` or Mosquitto on a free
port, or a vhost of the run's own on the machine's RabbitMQ. The sink's two faults become two
broker outages of ``--fault-seconds`` each (the server stopped and started again on the same
port and store; for RabbitMQ, the vhost's permissions cleared and its connections closed, then
restored). The broker's own consumer reads from before the traffic until it has every distinct
callback; its arrivals are reconciled like the sink's, a duplicate across an outage being
explained as such (NATS drops a retried publish within its duplicate window).

Run it with the project's interpreter (PostgreSQL and Redis on 127.0.0.1)::

    python scripts/chaos.py [--events 20000] [--json] [--timeout 900] [--flush db|all]
    python scripts/chaos.py --ordering per-key --events 3000
    python scripts/chaos.py --no-faults --servers 1 --workers 1 --events 5000
    python scripts/chaos.py --destination nats --events 5000
    python scripts/chaos.py --redis-outage sigkill --events 20000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import redis.asyncio
from arq.constants import health_check_key_suffix, in_progress_key_prefix
from benchlib import (
    HOST,
    POLL_INTERVAL_SECONDS,
    READY_TIMEOUT_SECONDS,
    BenchError,
    Server,
    admin_execute,
    at_least,
    bounded,
    free_port,
    kill_server,
    process_cpu_seconds,
    relay_argv,
    relay_command,
    relay_env,
    require_local,
    sigterm_interrupts,
    start_server,
    stop_server,
    uvicorn_argv,
    wait_ready,
    wait_redis_key,
)
from broker_bench import BROKERS, BrokerOutage, toml_table
from harness import machine_cpu

from receivers.dedup import dedup_key
from receivers.kinds import kind_for
from relay.dispatch.jobs import QUEUE_NAME
from relay.simulator.clocks import ScaledClock
from relay.simulator.platform import CallbackResult, Platform
from relay.simulator.run import RunOptions, run_units
from relay.simulator.scenarios import SCENARIOS, Callback
from relay.simulator.wire import Endpoint, prepare

DEFAULT_PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/11"
SOURCE = "default"
DESTINATION = "sink"
SINK_PATH = "/relay"
DESTINATION_TIMEOUT_S = 1.0
WORKER_HEALTH_KEY = QUEUE_NAME + health_check_key_suffix  # written by arq after on_startup
IN_PROGRESS_MATCH = in_progress_key_prefix + "relay:deliver:*"
FAULT_SHARES = (0.10, 0.25, 0.40, 0.55, 0.70, 0.85)
STOP_GRACE_SECONDS = 20.0
SETTLE_POLL_SECONDS = 0.5
DEFAULT_INGEST_SECONDS = 40.0
DEFAULT_TIME_SCALE = 0.1
# --no-faults: a retry (e.g. numinfo answered after its 2 s budget) waits 1 min * 0.001 = 60 ms.
NO_FAULTS_TIME_SCALE = 0.001
BROKER_IN_FLIGHT_SECONDS = 5.0
"""A broker's consumer sees a message some time after it was published (a moment, or seconds
when the broker hands over its backlog after an outage): a duplicate whose first copy reached
the consumer this soon after a kill or an outage is still explained by it. The HTTP sink
records a POST when it arrives: no slack there."""
BROKER_IDLE_SECONDS = 60.0  # a broker's consumer stops after this long without a new message
REPORT_MARGIN_SECONDS = 20.0  # kept from --timeout for the reconciliation and the clean-up
ORDER_SAMPLES = 10  # out-of-order events shown with their lines
LOG_PATTERNS = {
    "tracebacks": re.compile(r"^Traceback"),
    "lease expired during attempt": re.compile(r"lease of delivery .* expired"),
    "dead deliveries": re.compile(r"delivery .* is dead"),
    "sweep failed": re.compile(r"sweep failed"),
    "arq max retries": re.compile(r"max retries"),
    "job timeouts": re.compile(r"TimeoutError|timed out", re.IGNORECASE),
    "errors": re.compile(r"\bERROR\b|\bError\b"),
    "queue lost": re.compile(r"queue lost: "),
    "queue back": re.compile(r"queue back after "),
    "redis exceptions in tracebacks": re.compile(r"^redis\.exceptions\."),
}


# --- the deployment ------------------------------------------------------------------------------


def write_config(
    workdir: Path, database_url: str, redis_url: str, token: str, destination: str, concurrency: int
) -> Path:
    """The run's settings; ``destination`` is the ``[destinations.sink]`` table."""
    config = workdir / "relay.toml"
    config.write_text(
        f'database_url = "{database_url}"\n'
        f'redis_url = "{redis_url}"\n'
        'sweep_interval = "1s"\n'
        'lease_margin = "2s"\n'
        f"worker_concurrency = {concurrency}\n"
        "\n"
        f'[sources.{SOURCE}]\ntoken = "{token}"\n'
        "\n" + destination + "\n"
        "[policies.chaos]\n"
        'type = "delays"\n'
        'delays = ["1s", "2s"]\n'
        'then = "2s"\n'
        'give_up_after = "10m"\n',
        encoding="utf-8",
    )
    return config


@dataclass
class Fault:
    """One injected fault: when (seconds since the traffic started, and wall clock) and what."""

    t: float
    at: float
    name: str
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t, 2),
            "at": datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds"),
            "fault": self.name,
            "detail": self.detail,
        }

    def as_text(self) -> str:
        clock = datetime.fromtimestamp(self.at).strftime("%H:%M:%S.%f")[:-3]
        return f"t={self.t:7.2f}s  {clock}  {self.name}{': ' + self.detail if self.detail else ''}"


class PrivateRedis:
    """``--redis-outage``: the run's own ``redis-server`` on ``port``, with an append-only file
    in ``workdir`` (as docs/operations.md advises), stopped and started again on that port."""

    def __init__(self, workdir: Path, port: int) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise BenchError("--redis-outage needs the redis-server binary")
        self.binary, self.workdir, self.port = binary, workdir, port
        self.url = f"redis://{HOST}:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with (self.workdir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *(self.binary, "--port", str(self.port), "--bind", HOST),
                    *("--save", "", "--appendonly", "yes", "--dir", str(self.workdir)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        client = redis.Redis(host=HOST, port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        try:
            while True:
                try:
                    if client.ping():
                        return
                except (redis.RedisError, OSError):
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop(signal.SIGKILL)
                    raise BenchError(f"redis-server on port {self.port} did not start")
                time.sleep(POLL_INTERVAL_SECONDS)
        finally:
            client.close()

    def stop(self, how: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(how)
            self.process.wait(timeout=STOP_GRACE_SECONDS)

    def close(self) -> None:
        self.stop(signal.SIGTERM)


class Deployment:
    """The processes of the run: sink, serve-1..N, worker-1..M. Every process ever started is
    kept in ``started`` (for the clean-up); ``current`` maps a role to its live process."""

    def __init__(
        self, workdir: Path, redis_url: str, redis_server: PrivateRedis | None = None
    ) -> None:
        self.workdir = workdir
        self.redis_url = redis_url
        self.redis_server = redis_server
        """The run's own Redis (``--redis-outage``), or None."""
        self.env = relay_env()
        self.started: list[Server] = []
        self.current: dict[str, Server] = {}
        self.argv: dict[str, list[str]] = {}
        self.ports: dict[str, int] = {}
        self.generation: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self.t0 = time.monotonic()
        self.quiet = False

    def start(self, role: str) -> Server:
        self.generation[role] += 1
        name = f"{role}.{self.generation[role]}"
        server = start_server(
            name, self.argv[role], self.ports.get(role, 0), self.workdir, self.env
        )
        self.started.append(server)
        self.current[role] = server
        return server

    async def start_ready(self, role: str) -> Server:
        if role.startswith("worker"):
            client = redis.asyncio.Redis.from_url(self.redis_url)
            try:
                await client.delete(WORKER_HEALTH_KEY)
            finally:
                await client.aclose()
            server = self.start(role)
            await wait_redis_key(server, self.redis_url, WORKER_HEALTH_KEY)
            return server
        server = self.start(role)
        await wait_ready(server, "/_bench/healthz" if role == "sink" else "/readyz")
        return server

    def check_alive(self) -> None:
        """A BenchError naming the first process that exited on its own (with its log's
        tail): only the faults stop processes."""
        for role, server in self.current.items():
            if server.process.poll() is not None:
                raise BenchError(f"{role} exited:\n{server.log_tail()}")

    def note(self, name: str, detail: str = "") -> Fault:
        fault = Fault(time.monotonic() - self.t0, time.time(), name, detail)
        self.faults.append(fault)
        print(fault.as_text(), file=sys.stderr, flush=True)
        return fault

    def stop_all(self) -> None:
        """Stop every process still running (serve and workers first, the sink last)."""
        order = sorted(self.started, key=lambda server: server.name.startswith("sink"))
        for server in order:
            try:
                if server.process.poll() is None:
                    server.process.send_signal(signal.SIGTERM)
                    try:
                        server.process.wait(timeout=STOP_GRACE_SECONDS)
                    except subprocess.TimeoutExpired:
                        print(f"warning: {server.name} ignored SIGTERM; killed", file=sys.stderr)
                        kill_server(server)
                server.process.wait()
            except Exception as exc:  # keep stopping the others
                print(f"warning: stopping {server.name} failed: {exc}", file=sys.stderr)
        self.current.clear()

    def cpu_snapshot(self) -> dict[str, float]:
        """CPU seconds so far: every live process by name, this process (``driver``: the
        simulator and the checks) and the whole machine (``machine``, all cores)."""
        snapshot = {
            server.name: process_cpu_seconds(server.process.pid)
            for server in self.started
            if server.process.poll() is None
        }
        snapshot["driver"] = time.process_time()
        snapshot["machine"] = machine_cpu()[0]
        return snapshot

    def log_notes(self) -> dict[str, Any]:
        """Counts of notable lines in every process's log, with a few samples."""
        counts: Counter[str] = Counter()
        samples: dict[str, list[str]] = {}
        for server in self.started:
            try:
                lines = server.log_path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                for label, pattern in LOG_PATTERNS.items():
                    if pattern.search(line):
                        counts[label] += 1
                        kept = samples.setdefault(label, [])
                        if len(kept) < 3:
                            kept.append(f"{server.name}: {line.strip()[:300]}")
        return {"counts": dict(counts), "samples": samples}


def destination_settings() -> dict[str, str]:
    """The timeout and policy of the run's one destination, whatever its type."""
    return {"timeout": f"{DESTINATION_TIMEOUT_S:g}s", "policy": "chaos"}


def http_table(sink_url: str, ordering: str = "none") -> str:
    table = {"type": "http", "url": sink_url, "format": "envelope", **destination_settings()}
    if ordering != "none":
        table["ordering"] = ordering  # the order key stays the default, {platform_id}
    return toml_table(f"destinations.{DESTINATION}", table)


# --- the sink ------------------------------------------------------------------------------------


class SinkControl:
    def __init__(self, port: int) -> None:
        self.base = f"http://{HOST}:{port}"
        self.url = self.base + SINK_PATH
        self.client = httpx.AsyncClient(timeout=30, trust_env=False)

    async def mode(self, mode: str, delay: float = 0.0) -> None:
        answer = await self.client.post(
            self.base + "/_bench/mode", json={"mode": mode, "delay": delay}
        )
        answer.raise_for_status()

    async def answers(self) -> list[list[Any]]:
        answer = await self.client.get(self.base + "/_bench/answers", timeout=120)
        answer.raise_for_status()
        return list(answer.json())

    async def aclose(self) -> None:
        await self.client.aclose()


# --- the traffic ---------------------------------------------------------------------------------


def plan_callbacks(total: int, seed: int) -> list[list[Callback]]:
    """Scenario instances, every scenario in turn, cut so that there are ``total`` callbacks."""
    rng = random.Random(seed)
    names = list(SCENARIOS)
    units: list[list[Callback]] = []
    count = 0
    while count < total:
        unit = SCENARIOS[names[len(units) % len(names)]].build(rng, {})[: total - count]
        units.append(unit)
        count += len(unit)
    return units


def distinct_callbacks(units: Sequence[Sequence[Callback]]) -> int:
    """How many events the callbacks are for the receivers (their dedup keys)."""
    endpoint = Endpoint.parse(f"http://{HOST}/hooks")
    keys = set()
    for unit in units:
        for callback in unit:
            raw = prepare(callback, endpoint).body or b""
            kind = kind_for(callback.kind, callback.body)  # the row the receivers pick
            payload = kind.model.model_validate(callback.body).to_stored()  # as the receivers do
            keys.add((callback.kind, dedup_key(kind, payload, raw)))
    return len(keys)


@dataclass
class Traffic:
    """What the platform saw."""

    callbacks: int
    distinct: int
    results: list[CallbackResult] = field(default_factory=list)
    acked_ids: set[str] = field(default_factory=set)
    done: int = 0
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    ended_at: float = 0.0
    started_wall: float = 0.0  # time.time() of the start, the sink's clock

    @property
    def given_up(self) -> int:
        return sum(result.given_up for result in self.results)

    @property
    def attempts(self) -> int:
        return sum(len(result.attempts) for result in self.results)

    @property
    def failed_attempts(self) -> int:
        return sum(
            1
            for result in self.results
            for attempt in result.attempts
            if attempt.status_code is None or attempt.status_code >= 300
        )


async def play(
    traffic: Traffic,
    units: Sequence[list[Callback]],
    ports: Sequence[int],
    token: str,
    args: argparse.Namespace,
) -> None:
    """The platform: scenario instances alternate between the serve processes."""

    async def capture(response: httpx.Response) -> None:
        if response.status_code == 200 and response.request.url.path.startswith("/hooks"):
            await response.aread()
            with contextlib.suppress(ValueError, KeyError, TypeError):
                traffic.acked_ids.add(str(response.json()["id"]))

    def progress(count: int) -> None:
        traffic.done += count

    rate = args.events / args.ingest_seconds if args.ingest_seconds > 0 else None
    options = RunOptions(
        concurrency=args.concurrency, rate=rate / len(ports) if rate else None, shuffle=False
    )
    limits = httpx.Limits(max_connections=len(ports) * args.concurrency + 10)
    clock = ScaledClock(args.time_scale)
    async with httpx.AsyncClient(
        limits=limits, trust_env=False, event_hooks={"response": [capture]}
    ) as client:
        platforms = [
            Platform(
                client,
                Endpoint.parse(f"http://{HOST}:{port}/hooks?token={token}"),
                clock=clock,
                rng=random.Random(args.seed + number),
            )
            for number, port in enumerate(ports)
        ]
        shares = [list(units[number :: len(ports)]) for number in range(len(ports))]
        try:
            played = await asyncio.gather(
                *(
                    run_units(platform, share, options, progress)
                    for platform, share in zip(platforms, shares, strict=True)
                )
            )
        finally:
            traffic.ended_at = time.monotonic()
            traffic.finished.set()
    traffic.results = [result for results in played for result in results]


# --- the faults ----------------------------------------------------------------------------------


async def inject_faults(
    deployment: Deployment,
    sink: SinkControl | BrokerOutage,
    traffic: Traffic,
    args: argparse.Namespace,
) -> None:
    """The faults, one after the other, each once its share of the traffic has been sent."""

    async def reach(share: float) -> None:
        while traffic.done < share * traffic.callbacks and not traffic.finished.is_set():
            await asyncio.sleep(POLL_INTERVAL_SECONDS)

    async def sink_fault(mode: str, delay: float, what: str) -> None:
        if isinstance(sink, BrokerOutage):
            await broker_outage(sink)
            return
        await sink.mode(mode, delay)
        deployment.note(f"sink {what}", f"for {args.fault_seconds:g} s")
        try:
            await asyncio.sleep(args.fault_seconds)
        finally:
            await sink.mode("ok")
        deployment.note("sink recovers", "answers 200 at once again")

    async def broker_outage(broker: BrokerOutage) -> None:
        how = await asyncio.to_thread(broker.down)
        deployment.note(f"broker down: {broker.what}", f"{how}, for {args.fault_seconds:g} s")
        try:
            await asyncio.sleep(args.fault_seconds)
        finally:
            how = await asyncio.to_thread(broker.up)
        deployment.note(f"broker back: {broker.what}", how)

    async def kill_worker(role: str) -> None:
        server = deployment.current[role]
        running = await jobs_in_progress(deployment.redis_url)
        kill_server(server)
        deployment.note(
            f"SIGKILL {role}",
            f"pid {server.process.pid}; {running} jobs were running ({args.workers} workers)",
        )
        await asyncio.sleep(args.restart_delay)
        began = time.monotonic()
        server = await deployment.start_ready(role)
        deployment.note(
            f"{role} started again",
            f"pid {server.process.pid}, ready in {time.monotonic() - began:.1f} s",
        )

    async def restart_serve(role: str) -> None:
        server = deployment.current[role]
        began = time.monotonic()
        deployment.note(f"SIGTERM {role}", f"pid {server.process.pid}, port {server.port}")
        status = await asyncio.to_thread(stop_server, server)  # SIGTERM, wait for the exit
        stopped = time.monotonic()
        server = await deployment.start_ready(role)
        deployment.note(
            f"{role} started again",
            f"pid {server.process.pid}; the old one exited with {status} after "
            f"{stopped - began:.1f} s, down {time.monotonic() - began:.1f} s in all",
        )

    async def flush() -> None:
        client = redis.asyncio.Redis.from_url(deployment.redis_url)
        try:
            queued = await client.zcard(QUEUE_NAME)
            if args.flush == "all":
                await client.flushall()
            else:
                await client.flushdb()
        finally:
            await client.aclose()
        what = "FLUSHALL" if args.flush == "all" else "FLUSHDB"
        deployment.note(f"Redis {what}", f"{queued} jobs were queued or running")

    async def redis_outage() -> None:
        server = deployment.redis_server
        assert server is not None
        how = signal.Signals[args.redis_outage.upper()]
        queued = await jobs_in_progress(deployment.redis_url)
        await asyncio.to_thread(server.stop, how)
        deployment.note(
            f"Redis down ({how.name})",
            f"port {server.port}, {queued} jobs were running; for {args.fault_seconds:g} s",
        )
        await asyncio.sleep(args.fault_seconds)
        await asyncio.to_thread(server.start)
        deployment.note("Redis back", f"started again on port {server.port}, same data")

    steps: list[Callable[[], Coroutine[Any, Any, None]]] = [
        lambda: sink_fault("fail", 0.0, "answers HTTP 500"),
        lambda: kill_worker("worker-1"),
        lambda: restart_serve("serve-2"),
        flush if args.redis_outage == "none" else redis_outage,
        lambda: sink_fault("slow", args.slow_seconds, f"answers after {args.slow_seconds:g} s"),
        lambda: kill_worker("worker-2"),
    ]
    for share, step in zip(FAULT_SHARES, steps, strict=True):
        await reach(share)
        deployment.check_alive()  # else a kill or restart would hide a process that died
        await step()
    deployment.check_alive()


async def no_faults() -> None:
    """--no-faults: nothing is injected; the sink stays healthy."""


async def jobs_in_progress(url: str) -> int:
    """arq's in-progress markers of the relay's deliver jobs (of every worker)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        return len([key async for key in client.scan_iter(match=IN_PROGRESS_MATCH, count=1000)])
    finally:
        await client.aclose()


# --- settling and the reconciliation -------------------------------------------------------------


async def pending_work(conn: asyncpg.Connection) -> tuple[int, int, int]:
    """(unrouted events, deliveries neither succeeded nor dead, events without a delivery)."""
    unrouted = await conn.fetchval(
        "SELECT count(*) FROM received_events e "
        "LEFT JOIN routed_events r ON r.event_id = e.id WHERE r.event_id IS NULL"
    )
    open_ = await conn.fetchval(
        "SELECT count(*) FROM deliveries WHERE status NOT IN ('succeeded', 'dead')"
    )
    missing = await conn.fetchval(
        "SELECT count(*) FROM received_events e WHERE NOT EXISTS "
        "(SELECT 1 FROM deliveries d WHERE d.event_id = e.id AND d.destination = $1)",
        DESTINATION,
    )
    return int(unrouted), int(open_), int(missing)


async def settle(dsn: str, deadline: float, deployment: Deployment) -> bool:
    """Until every event is routed and every delivery succeeded or dead (False at the deadline)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        last_print = 0.0
        while True:
            unrouted, open_, missing = await pending_work(conn)
            if not (unrouted or open_ or missing):
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if now - last_print >= 10:
                last_print = now
                print(
                    f"t={now - deployment.t0:7.2f}s  waiting: {open_} deliveries open, "
                    f"{unrouted} events unrouted, {missing} without a delivery",
                    file=sys.stderr,
                    flush=True,
                )
            deployment.check_alive()
            await asyncio.sleep(SETTLE_POLL_SECONDS)
    finally:
        await conn.close()


@dataclass
class Store:
    received_at: dict[str, float]
    statuses: dict[str, str]  # event id -> delivery status at the sink destination
    attempts: dict[str, int]
    arrival_order: list[str] = field(default_factory=list)  # ORDER BY received_at, id
    order_keys: dict[str, str] = field(default_factory=dict)  # deliveries.order_key, else
    # received_events.platform_id (events with neither are left out)
    labels: dict[str, str] = field(default_factory=dict)  # event id -> "kind event_name"
    attempt_log: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    async def read(cls, dsn: str) -> Store:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            # The order the relay's per-key lines follow (relay.outbox.ordering): arrival, then the
            # id, both compared by PostgreSQL.
            events = await conn.fetch(
                "SELECT e.id, e.received_at, e.kind, e.event_name, e.platform_id, "
                "d.order_key, d.status, d.attempts "
                "FROM received_events e "
                "LEFT JOIN deliveries d ON d.event_id = e.id AND d.destination = $1 "
                "ORDER BY e.received_at, e.id",
                DESTINATION,
            )
            attempts = await conn.fetch(
                "SELECT d.event_id, a.number, a.started_at, a.duration_ms, a.status_code, "
                "a.error FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id "
                "WHERE d.destination = $1 ORDER BY d.event_id, a.number",
                DESTINATION,
            )
        finally:
            await conn.close()
        attempt_log: dict[str, list[dict[str, Any]]] = {}
        for row in attempts:
            attempt_log.setdefault(row["event_id"], []).append(
                {
                    "number": row["number"],
                    "started_at": round(row["started_at"].timestamp(), 3),
                    "ms": round(row["duration_ms"]),
                    "status": row["status_code"],
                    "error": row["error"],
                }
            )
        delivered = [row for row in events if row["status"] is not None]
        return cls(
            {row["id"]: row["received_at"].timestamp() for row in events},
            {row["id"]: row["status"] for row in delivered},
            {row["id"]: row["attempts"] for row in delivered},
            [row["id"] for row in events],
            {
                row["id"]: row["order_key"] or row["platform_id"]
                for row in events
                if row["order_key"] or row["platform_id"]
            },
            {row["id"]: f"{row['kind']} {row['event_name'] or '-'}" for row in events},
            attempt_log,
        )


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return math.nan
    return sorted(values)[max(1, math.ceil(fraction * len(values))) - 1]


@dataclass
class OrderCheck:
    """The sink's arrivals against the receivers' order, per order key (see ``check_order``)."""

    ordered_keys: int = 0  # keys with two events or more
    ordered_events: int = 0  # the events of those keys
    out_of_order: int = 0
    late_repeats: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)


def check_order(
    store: Store,
    in_time: dict[str, float],
    successes: dict[str, list[tuple[float, str]]],
    dead: set[str],
) -> OrderCheck:
    """Per order key, the events in the order the receivers stored them (``received_at``, then
    the id): ``out_of_order`` counts the events whose first in-time 2xx arrival at the sink came
    before the first in-time 2xx arrival of an earlier event of their key; ``late_repeats`` the
    2xx arrivals of an event, other than its first in-time one, after the first in-time 2xx of a
    later event of its key. Dead deliveries, and events never answered 2xx in time (counted as
    lost), are left out of both."""
    lines: dict[str, list[str]] = {}
    for event_id in store.arrival_order:
        key = store.order_keys.get(event_id)
        if key is not None:
            lines.setdefault(key, []).append(event_id)
    check = OrderCheck()
    for key, line in lines.items():
        if len(line) < 2:
            continue
        check.ordered_keys += 1
        check.ordered_events += len(line)
        compared = [event_id for event_id in line if event_id in in_time and event_id not in dead]
        latest, latest_id = -math.inf, ""
        for event_id in compared:
            if in_time[event_id] < latest:
                check.out_of_order += 1
                if len(check.samples) < ORDER_SAMPLES:
                    check.samples.append(
                        order_sample(store, key, line, event_id, latest_id, in_time, successes)
                    )
            else:
                latest, latest_id = in_time[event_id], event_id
        earliest_later = math.inf
        for event_id in reversed(compared):
            first_seen = False
            for arrived, mode in successes[event_id]:
                if not first_seen and mode == "ok" and arrived == in_time[event_id]:
                    first_seen = True  # the first in-time 2xx: compared above
                elif arrived > earliest_later:
                    check.late_repeats += 1
            earliest_later = min(earliest_later, in_time[event_id])
    return check


def order_sample(
    store: Store,
    key: str,
    line: Sequence[str],
    event_id: str,
    overtaken: str,
    in_time: dict[str, float],
    successes: dict[str, list[tuple[float, str]]],
) -> dict[str, Any]:
    """One out-of-order event with its whole line: every event of the key in arrival order,
    its delivery (status, attempts as recorded) and its 2xx arrivals at the sink."""
    return {
        "order_key": key,
        "event_id": event_id,
        "overtook": overtaken,
        "line": [
            {
                "event_id": other,
                "what": store.labels.get(other),
                "received_at": round(store.received_at[other], 3),
                "first_in_time": round(in_time[other], 3) if other in in_time else None,
                "arrivals_2xx": [[round(at, 3), mode] for at, mode in successes.get(other, [])],
                "status": store.statuses.get(other),
                "attempts": store.attempt_log.get(other, []),
            }
            for other in line
        ],
    }


@dataclass
class Reconciliation:
    accepted: int
    delivered: int
    lost: int
    duplicates: int
    dead: int
    max_lag_s: float
    lag_p50_s: float
    lag_p99_s: float
    duplicate_reasons: dict[str, int]
    late_only: int
    unknown_at_sink: int
    succeeded_not_seen: int
    sink_requests: Counter[str]
    deliveries: Counter[str]
    attempts_total: int
    lost_ids: list[str]
    unexplained: list[dict[str, Any]]
    last_delivery_at: float = math.nan  # time.time() of the last first in-time 2xx
    order: OrderCheck = field(default_factory=OrderCheck)

    @classmethod
    def compute(
        cls,
        store: Store,
        answers: Sequence[Sequence[Any]],
        faults: Sequence[Fault],
        slack: float = 0.0,
    ) -> Reconciliation:
        """``slack``: how long after a kill or an outage the first copy of a duplicate may
        have arrived and still be explained by it."""
        kills = [fault.at for fault in faults if fault.name.startswith("SIGKILL")]
        flushes = [fault.at for fault in faults if fault.name.startswith("Redis FLUSH")]
        redis_outages = [
            fault.at for fault in faults if fault.name.startswith(("Redis down", "Redis back"))
        ]
        outages = [fault.at for fault in faults if fault.name.startswith("broker back")]
        in_time: dict[str, float] = {}  # first 2xx answered in time
        successes: dict[str, list[tuple[float, str]]] = {}  # every 2xx: (arrival, mode)
        sink_requests: Counter[str] = Counter()
        for webhook_id, arrived, _received_at, status, mode in answers:
            sink_requests[f"{mode} {status}"] += 1
            if 200 <= status < 300:
                successes.setdefault(webhook_id, []).append((float(arrived), mode))
                if mode == "ok" and webhook_id not in in_time:
                    in_time[webhook_id] = float(arrived)
        accepted = set(store.received_at)
        delivered = accepted & set(in_time)
        dead = {event_id for event_id, status in store.statuses.items() if status == "dead"}
        lost = accepted - delivered - dead
        reasons: Counter[str] = Counter()
        unexplained: list[dict[str, Any]] = []
        for webhook_id, arrivals in successes.items():
            for (before, mode), (after, _) in pairwise(arrivals):
                if mode == "slow":
                    reasons["after a time-out"] += 1
                elif any(before - slack <= kill <= after for kill in kills):
                    reasons["across a worker kill"] += 1
                elif any(before <= flush <= after for flush in flushes):
                    reasons["across the Redis flush"] += 1
                elif any(before <= change <= after for change in redis_outages):
                    reasons["across the Redis outage"] += 1
                elif any(before - slack <= back <= after for back in outages):
                    reasons["across a broker outage"] += 1
                else:
                    reasons["unexplained"] += 1
                    if len(unexplained) < 10:
                        unexplained.append(
                            {
                                "event_id": webhook_id,
                                "arrivals": [round(a, 3) for a, _ in arrivals],
                                "attempts": store.attempts.get(webhook_id),
                            }
                        )
        lags = [in_time[event_id] - store.received_at[event_id] for event_id in delivered]
        succeeded = {event_id for event_id, s in store.statuses.items() if s == "succeeded"}
        return cls(
            accepted=len(accepted),
            delivered=len(delivered),
            lost=len(lost),
            duplicates=sum(len(arrivals) - 1 for arrivals in successes.values()),
            dead=len(dead),
            max_lag_s=max(lags, default=math.nan),
            lag_p50_s=percentile(lags, 0.50),
            lag_p99_s=percentile(lags, 0.99),
            duplicate_reasons=dict(reasons),
            late_only=len(set(successes) - set(in_time)),
            unknown_at_sink=len(set(successes) - accepted),
            succeeded_not_seen=len(succeeded - set(in_time)),
            sink_requests=sink_requests,
            deliveries=Counter(store.statuses.values()),
            attempts_total=sum(store.attempts.values()),
            lost_ids=sorted(lost)[:20],
            unexplained=unexplained,
            last_delivery_at=max((in_time[event_id] for event_id in delivered), default=math.nan),
            order=check_order(store, in_time, successes, dead),
        )


# --- the whole run -------------------------------------------------------------------------------


@dataclass
class Report:
    args: argparse.Namespace
    traffic: Traffic
    result: Reconciliation
    faults: list[Fault]
    settled: bool
    duration_s: float
    traffic_s: float
    log_notes: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        r, t = self.result, self.traffic
        found = []
        if r.lost:
            found.append(f"{r.lost} accepted events were never delivered")
        if not self.settled:
            found.append("deliveries were still open at the deadline")
        if t.given_up:
            found.append(f"the platform gave up on {t.given_up} callbacks")
        if r.accepted != t.distinct:
            found.append(f"{r.accepted} events stored for {t.distinct} distinct callbacks sent")
        if len(t.acked_ids) != r.accepted:
            found.append(f"{len(t.acked_ids)} distinct ids acknowledged, {r.accepted} stored")
        if r.unknown_at_sink:
            found.append(f"{r.unknown_at_sink} ids at the sink are not in the store")
        if r.succeeded_not_seen:
            found.append(f"{r.succeeded_not_seen} deliveries succeeded but the sink has no 2xx")
        if self.args.ordering == "per-key" and r.order.out_of_order:
            found.append(
                f"{r.order.out_of_order} events reached the sink before an earlier event of "
                "their order key (ordering per-key)"
            )
        return found

    @property
    def events_per_s(self) -> float:
        """Accepted events / (last delivery arriving at the sink - first callback sent)."""
        window = self.result.last_delivery_at - self.traffic.started_wall
        return self.result.accepted / window if window > 0 else math.nan

    @property
    def ingest_per_s(self) -> float:
        """Accepted events / the platform's traffic time."""
        return self.result.accepted / self.traffic_s if self.traffic_s > 0 else math.nan

    def as_json(self) -> dict[str, Any]:
        r, t = self.result, self.traffic
        return {
            "destination": self.args.destination,
            "accepted": r.accepted,
            "delivered": r.delivered,
            "lost": r.lost,
            "duplicates": r.duplicates,
            "dead": r.dead,
            "max_lag_s": _round(r.max_lag_s),
            "lag_p50_s": _round(r.lag_p50_s),
            "lag_p99_s": _round(r.lag_p99_s),
            "ordering": self.args.ordering,
            "out_of_order": r.order.out_of_order,
            "late_repeats": r.order.late_repeats,
            "ordered_keys": r.order.ordered_keys,
            "ordered_events": r.order.ordered_events,
            "callbacks": t.callbacks,
            "distinct_callbacks": t.distinct,
            "acked_ids": len(t.acked_ids),
            "given_up": t.given_up,
            "platform_attempts": t.attempts,
            "platform_failed_attempts": t.failed_attempts,
            "duplicate_reasons": r.duplicate_reasons,
            "late_only": r.late_only,
            "unknown_at_sink": r.unknown_at_sink,
            "succeeded_not_seen": r.succeeded_not_seen,
            "deliveries": dict(r.deliveries),
            "delivery_attempts": r.attempts_total,
            "sink_requests": dict(r.sink_requests),
            "settled": self.settled,
            "faults": [fault.as_json() for fault in self.faults],
            "duration_s": round(self.duration_s, 1),
            "traffic_s": round(self.traffic_s, 1),
            "events_per_s": _round(self.events_per_s),
            "ingest_per_s": _round(self.ingest_per_s),
            "delivery_window_s": _round(r.last_delivery_at - t.started_wall),
            "servers": self.args.servers,
            "workers": self.args.workers,
            "faults_injected": not self.args.no_faults,
            "time_scale": self.args.time_scale,
            "ingest_seconds": self.args.ingest_seconds,
            "cpu_cores": self.cpu,
            "lost_ids": r.lost_ids,
            "unexplained_duplicates": r.unexplained,
            "out_of_order_samples": r.order.samples,
            "log_notes": self.log_notes,
            "problems": self.problems,
        }

    def as_text(self) -> str:
        r, t = self.result, self.traffic
        reasons = ", ".join(f"{why} {n}" for why, n in sorted(r.duplicate_reasons.items()))
        statuses = ", ".join(f"{status} {n}" for status, n in sorted(r.deliveries.items()))
        sink = ", ".join(f"{what} {n}" for what, n in sorted(r.sink_requests.items()))
        lines = [
            f"chaos run: {t.callbacks} callbacks to {self.args.servers} serve processes, "
            f"{self.args.workers} workers, ordering {self.args.ordering}, "
            f"{self.duration_s:.1f} s in all (traffic {self.traffic_s:.1f} s)",
            "faults:" if self.faults else "faults: none injected (--no-faults)",
            *(f"  {fault.as_text()}" for fault in self.faults),
            "",
            f"{'accepted':<22}{r.accepted:>8}   rows in received_events; distinct callbacks "
            f"sent {t.distinct}, ids acked {len(t.acked_ids)}",
            f"{'delivered':<22}{r.delivered:>8}   distinct event ids answered 2xx in time at "
            "the sink",
            f"{'lost':<22}{r.lost:>8}   accepted, never delivered, not dead",
            f"{'duplicates delivered':<22}{r.duplicates:>8}   2xx answers beyond the first per "
            f"event id: {reasons or 'none'}",
            f"{'dead':<22}{r.dead:>8}",
            f"{'max lag':<22}{r.max_lag_s:>8.1f} s received_at -> first in-time 2xx at the sink "
            f"(p50 {r.lag_p50_s:.2f} s, p99 {r.lag_p99_s:.1f} s)",
            f"{'out of order':<22}{r.order.out_of_order:>8}   events whose first in-time 2xx came "
            "before that of an earlier event of their key "
            + (
                "(ordering per-key: must be 0)"
                if self.args.ordering == "per-key"
                else "(ordering none: keys go in parallel, informative)"
            ),
            f"{'late repeats':<22}{r.order.late_repeats:>8}   2xx copies of an event after a "
            "later event of its key had arrived (informative)",
            f"{'ordered keys':<22}{r.order.ordered_keys:>8}   keys with 2 events or more "
            f"({r.order.ordered_events} events)",
            "",
            f"platform: {t.attempts} requests for {t.callbacks} callbacks "
            f"({t.failed_attempts} failed and retried), given up {t.given_up}",
            f"deliveries in SQL: {statuses}; {r.attempts_total} attempts recorded",
            f"sink: {sink}",
            f"throughput: {self.events_per_s:.1f} events/s end to end (first callback sent -> "
            f"last delivery at the sink, {r.last_delivery_at - t.started_wall:.1f} s), "
            f"ingest {self.ingest_per_s:.1f} events/s",
        ]
        if self.cpu:
            lines.append(
                "cpu, cores busy from the traffic's start to settled: "
                + ", ".join(f"{name} {value:g}" for name, value in self.cpu.items())
            )
        if r.duplicates:
            lines.append(
                "duplicates are at-least-once delivery at work: a time-out leaves the relay "
                "without the sink's late 200, so it sends again; a worker killed between its POST "
                "and recording the answer leaves the delivery leased, and arq re-runs the job once "
                "the lease and the in-progress marker have expired"
            )
        if r.unexplained:
            lines.append(f"unexplained duplicates (first ones): {json.dumps(r.unexplained)}")
        if self.args.ordering == "per-key" and r.order.samples:
            lines.append(
                f"out of order (first ones, with their lines): {json.dumps(r.order.samples)}"
            )
        if self.args.ordering == "per-key" and not r.order.ordered_keys:
            lines.append("no order key has two events: the ordering check compared nothing")
        if self.log_notes.get("counts"):
            notes = ", ".join(f"{k} {v}" for k, v in sorted(self.log_notes["counts"].items()))
            lines.append(f"process logs: {notes}")
        problems = self.problems
        lines.append("result: " + ("FAILED: " + "; ".join(problems) if problems else "ok"))
        return "\n".join(lines)


def cpu_cores(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float]:
    """Cores busy on average between two snapshots, per role (serve, worker, sink: summed over
    their processes; a process killed in between is missing), the driver, the machine, and the
    rest of the machine (PostgreSQL, Redis, anything else running)."""
    if seconds <= 0:
        return {}
    cores: Counter[str] = Counter()
    for name, spent in after.items():
        used = spent - before.get(name, 0.0)
        if not math.isnan(used):
            cores[name.split(".")[0].split("-")[0]] += used / seconds
    cores["rest"] = cores["machine"] - sum(v for k, v in cores.items() if k != "machine")
    cores["cores"] = os.cpu_count() or math.nan
    return {name: round(value, 2) for name, value in cores.items()}


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


async def run_async(
    args: argparse.Namespace, deployment: Deployment, database: str, deadline: float
) -> Report:
    base = args.pg_admin_dsn.rsplit("/", 1)[0]
    dsn = f"{base}/{database}"
    database_url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
    workdir = deployment.workdir
    flush_client = redis.asyncio.Redis.from_url(args.redis_url, socket_connect_timeout=5)
    try:
        await flush_client.flushdb()
    except (redis.RedisError, OSError) as exc:
        raise BenchError(f"Redis at {args.redis_url} is not usable: {exc}") from None
    finally:
        await flush_client.aclose()

    sink: SinkControl | BrokerOutage
    if args.destination in BROKERS:
        sink = await asyncio.to_thread(BrokerOutage, args.destination, workdir, free_port())
        table = sink.table(f"destinations.{DESTINATION}", **destination_settings())
    else:
        sink_port = free_port()
        deployment.ports["sink"] = sink_port
        deployment.argv["sink"] = uvicorn_argv("sink_app:app", sink_port)
        await deployment.start_ready("sink")
        sink = SinkControl(sink_port)
        table = http_table(sink.url, args.ordering)
    try:
        token = secrets.token_urlsafe(24)
        config = write_config(
            workdir, database_url, args.redis_url, token, table, args.worker_concurrency
        )
        upgrade = await asyncio.to_thread(
            subprocess.run,
            [*relay_command(), "db", "upgrade", "--config", str(config)],
            cwd=workdir,
            env=deployment.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if upgrade.returncode != 0:
            raise BenchError(f"relay db upgrade failed:\n{upgrade.stdout}{upgrade.stderr}")
        serves = [f"serve-{number}" for number in range(1, args.servers + 1)]
        workers = [f"worker-{number}" for number in range(1, args.workers + 1)]
        for role in serves:
            deployment.ports[role] = free_port()
            deployment.argv[role] = relay_argv(deployment.ports[role], config)
        worker_argv = [*relay_command(), "worker", "--config", str(config)]
        for role in workers:
            deployment.argv[role] = worker_argv
        for role in [*serves, *workers]:
            await deployment.start_ready(role)

        units = plan_callbacks(args.events, args.seed)
        traffic = Traffic(callbacks=sum(map(len, units)), distinct=distinct_callbacks(units))
        if isinstance(sink, BrokerOutage):
            idle = max(BROKER_IDLE_SECONDS, 3 * args.fault_seconds)
            await sink.start_consumer(traffic.distinct, idle)
        ports = [deployment.ports[role] for role in serves]
        print(
            f"t=   0.00s  traffic starts: {traffic.callbacks} callbacks "
            f"({traffic.distinct} distinct) to ports {', '.join(map(str, ports))}",
            file=sys.stderr,
            flush=True,
        )
        cpu_before = deployment.cpu_snapshot()
        deployment.t0 = traffic.started_at = time.monotonic()
        traffic.started_wall = time.time()
        player = asyncio.create_task(play(traffic, units, ports, token, args))
        injector = asyncio.create_task(
            no_faults() if args.no_faults else inject_faults(deployment, sink, traffic, args)
        )
        try:
            await asyncio.gather(player, injector)
        finally:
            for task in (player, injector):
                task.cancel()
            await asyncio.gather(player, injector, return_exceptions=True)
        deployment.note(
            "traffic done",
            f"{traffic.attempts} requests, given up {traffic.given_up}, "
            f"{len(traffic.acked_ids)} ids acknowledged",
        )
        settled = await settle(dsn, deadline - REPORT_MARGIN_SECONDS, deployment)
        cpu = cpu_cores(
            cpu_before, deployment.cpu_snapshot(), time.monotonic() - traffic.started_at
        )
        deployment.note("settled" if settled else "deadline: deliveries still open")
        store = await Store.read(dsn)
        if isinstance(sink, BrokerOutage):
            answers = await sink.answers(deadline - REPORT_MARGIN_SECONDS / 2)
        else:
            answers = await sink.answers()
    finally:
        await sink.aclose()
    slack = BROKER_IN_FLIGHT_SECONDS if isinstance(sink, BrokerOutage) else 0.0
    result = Reconciliation.compute(store, answers, deployment.faults, slack)
    return Report(
        args,
        traffic,
        result,
        [fault for fault in deployment.faults if fault.name not in ("traffic done", "settled")],
        settled,
        duration_s=0.0,
        traffic_s=traffic.ended_at - traffic.started_at,
        cpu=cpu,
    )


def drop_database(admin_dsn: str, database: str) -> None:
    try:
        asyncio.run(admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        print(f"warning: could not drop database {database}: {exc}", file=sys.stderr)


def flush_run_database(url: str) -> None:
    async def flush() -> None:
        client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=5)
        try:
            await client.flushdb()
        finally:
            await client.aclose()

    try:
        asyncio.run(flush())
    except (redis.RedisError, OSError) as exc:
        print(f"warning: could not flush {url}: {exc}", file=sys.stderr)


def run(args: argparse.Namespace, workdir: Path) -> Report:
    started = time.monotonic()
    deadline = started + args.timeout
    require_local(args.pg_admin_dsn, "PostgreSQL")
    require_local(args.redis_url, "Redis")
    database = f"chaos_{secrets.token_hex(6)}"
    created = False
    redis_server = PrivateRedis(workdir, free_port()) if args.redis_outage != "none" else None
    if redis_server is not None:
        args.redis_url = redis_server.url
    deployment = Deployment(workdir, args.redis_url, redis_server)
    with sigterm_interrupts():
        try:
            try:
                asyncio.run(admin_execute(args.pg_admin_dsn, f'CREATE DATABASE "{database}"'))
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                raise BenchError(
                    f"PostgreSQL at {args.pg_admin_dsn} is not usable: {exc}"
                ) from None
            created = True
            print(f"database {database}, work directory {workdir}", file=sys.stderr, flush=True)
            with asyncio.Runner() as runner:
                report = runner.run(
                    bounded(run_async(args, deployment, database, deadline), deadline)
                )
        finally:
            deployment.stop_all()
            if args.keep_logs is not None:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in workdir.glob("*.log"):
                    shutil.copy2(log, args.keep_logs / log.name)
            if created:
                drop_database(args.pg_admin_dsn, database)
            if redis_server is not None:
                redis_server.close()
            else:
                flush_run_database(args.redis_url)
    report.log_notes = deployment.log_notes()
    report.duration_s = time.monotonic() - started
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=at_least(1), default=20_000, help="callbacks to send")
    parser.add_argument("--timeout", type=float, default=900.0, help="overall limit, seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seed", type=int, default=20260301, help="scenario generator seed")
    parser.add_argument(
        "--ingest-seconds",
        type=float,
        default=None,
        help="spread the callbacks over at least this long (0: as fast as possible); "
        f"default {DEFAULT_INGEST_SECONDS:g}, or 0 with --no-faults",
    )
    parser.add_argument(
        "--no-faults",
        action="store_true",
        help="inject no fault (the sink always answers 200 at once): a throughput run",
    )
    parser.add_argument(
        "--servers", type=at_least(1), default=2, help="relay serve processes (default 2)"
    )
    parser.add_argument(
        "--workers", type=at_least(1), default=2, help="relay worker processes (default 2)"
    )
    parser.add_argument(
        "--concurrency",
        type=at_least(1),
        default=25,
        help="scenario instances in flight per serve process",
    )
    parser.add_argument(
        "--worker-concurrency", type=at_least(1), default=50, help="per relay worker"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="the platform's clock: its retry delays take this share of real time; "
        f"default {DEFAULT_TIME_SCALE:g}, or {NO_FAULTS_TIME_SCALE:g} with --no-faults",
    )
    parser.add_argument(
        "--fault-seconds",
        type=float,
        default=5.0,
        help="how long the sink fails (500) and how long it times out",
    )
    parser.add_argument(
        "--slow-seconds", type=float, default=2.0, help="the sink's answer delay while timing out"
    )
    parser.add_argument(
        "--restart-delay", type=float, default=1.0, help="seconds between a kill and the restart"
    )
    parser.add_argument(
        "--flush",
        choices=["all", "db"],
        default="db",
        help="db: FLUSHDB of the run's database only (default); all: FLUSHALL, every database "
        "of the server (only on a Redis of the run's own)",
    )
    parser.add_argument(
        "--redis-outage",
        choices=("none", "sigterm", "sigkill"),
        default="none",
        help="instead of the flush, stop Redis with this signal for --fault-seconds and start it "
        "again on the same port (a redis-server of the run's own; --redis-url is not used)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("RELAY_CHAOS_REDIS_URL", DEFAULT_REDIS_URL),
        help="the Redis database the relay uses (flushed at the start and the end)",
    )
    parser.add_argument(
        "--pg-admin-dsn",
        default=os.environ.get("RELAY_TEST_PG_DSN", DEFAULT_PG_ADMIN_DSN),
        help="where to CREATE and DROP the run's database",
    )
    parser.add_argument(
        "--keep-logs", type=Path, default=None, metavar="DIR", help="copy the process logs here"
    )
    parser.add_argument(
        "--destination",
        choices=("http", *BROKERS),
        default="http",
        help="http: the recording sink; amqp, nats, mqtt: a broker of the run's own, taken down "
        "twice (default: http)",
    )
    parser.add_argument(
        "--ordering",
        choices=("none", "per-key"),
        default="none",
        help="the sink destination's ordering; per-key: an event delivered before an earlier "
        "one of its key fails the run (default: none)",
    )
    args = parser.parse_args(argv)
    if args.time_scale is None:
        args.time_scale = NO_FAULTS_TIME_SCALE if args.no_faults else DEFAULT_TIME_SCALE
    if args.ingest_seconds is None:
        args.ingest_seconds = 0.0 if args.no_faults else DEFAULT_INGEST_SECONDS
    if not args.no_faults and (args.servers < 2 or args.workers < 2):
        parser.error("the faults need --servers and --workers of at least 2 (or --no-faults)")
    if args.ordering != "none" and args.destination != "http":
        parser.error("--ordering per-key is checked against the HTTP sink (--destination http)")
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive")
    if args.slow_seconds <= DESTINATION_TIMEOUT_S:
        parser.error(
            f"--slow-seconds must exceed the destination timeout ({DESTINATION_TIMEOUT_S} s)"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        try:
            report = run(args, Path(tmp))
        except BenchError as exc:
            print(f"chaos: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: everything has been cleaned up by now
            print("chaos: interrupted", file=sys.stderr)
            return 130
        except Exception:  # cleaned up as well; the run failed, not a check
            traceback.print_exc()
            print("chaos: the run failed", file=sys.stderr)
            return 2
    print(json.dumps(report.as_json()) if args.json else report.as_text())
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
