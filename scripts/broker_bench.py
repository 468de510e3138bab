"""A message broker as the sink of the relay's benchmark and chaos run (``--destination
amqp|nats|mqtt``).

The broker's own client does both sides: its consumer, in a process of its own
(``broker_consume.py``), reads what arrives (webhook-id and arrival time), and, for the
baseline, its publisher sends the same messages with the same confirmation mode as the relay's
destination. Everything broker-specific is in ``broker_<kind>.py`` (the kit); this module only
drives a kit.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import secrets
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from harness import toml_table

BROKERS = ("amqp", "nats", "mqtt")
SHARED_URLS = {"nats": "nats://127.0.0.1:4222", "mqtt": "mqtt://127.0.0.1:1883"}
"""The machine's brokers; amqp gets a vhost of its own on 127.0.0.1:5672 for each run."""
IDLE_TIMEOUT_SECONDS = 30.0
"""The consumer stops after this long without a new message."""
CONSUMER_READY_SECONDS = 1.0
"""Given to a fresh consumer to subscribe before anything is published (MQTT keeps nothing for
a subscriber that is not there yet)."""
SCRIPTS = Path(__file__).resolve().parent


@dataclass
class Published:
    """The baseline: the broker's own client publishing every message once."""

    sent: int
    confirmed: int
    started: float
    received: list[tuple[str, float]]
    client_cpu: float
    """The client's CPU seconds per second of publishing."""
    client_cpu_s: float
    """The client's CPU seconds for the whole publish."""


class BrokerSink:
    """One broker destination for one run: its place on the broker (``name``), the consumer
    process reading it back, and the ``received_at`` of the relayed events (from the relay's
    SQLite database) for the lag."""

    def __init__(self, broker: str, workdir: Path, database: Path) -> None:
        self.broker = broker
        self.kit: ModuleType = importlib.import_module(f"broker_{broker}")
        self.name = f"bench-{secrets.token_hex(4)}"
        self.workdir = workdir
        self.database = database
        if broker == "amqp":
            self.url = self.kit.make_vhost(self.name)
        else:
            self.url = SHARED_URLS[broker]
        self.consumer: subprocess.Popen[bytes] | None = None
        self._runs = 0
        self._out: Path | None = None

    def table(self) -> str:
        """The relay's ``[destinations.sink]`` table."""
        return toml_table("destinations.sink", self.kit.destination(self.url, self.name))

    @property
    def pid(self) -> int:
        return self.consumer.pid if self.consumer is not None else 0

    async def reset(self, count: int) -> None:
        """An empty place and a fresh consumer waiting for ``count`` messages."""
        self.stop_consumer()
        with contextlib.suppress(Exception):  # nothing to clean up on the first run
            await self.kit.cleanup(self.url, self.name)
        await self.kit.prepare(self.url, self.name)
        self._runs += 1
        self._out = self.workdir / f"consumed-{self._runs}.json"
        self.consumer = start_consumer(
            self.broker, self.url, self.name, count, IDLE_TIMEOUT_SECONDS, self._out
        )
        await asyncio.sleep(CONSUMER_READY_SECONDS)

    def done(self) -> bool:
        """Whether the consumer has stopped (it saw every message, or none came for a while)."""
        return self.consumer is not None and self.consumer.poll() is not None

    def received(self) -> list[tuple[str, float]]:
        """What the last consumer received: (webhook-id, arrival time), duplicates included."""
        if self._out is None or not self._out.exists():
            return []
        return [(str(i), float(t)) for i, t in json.loads(self._out.read_text("utf-8"))]

    def records(self) -> list[tuple[str, float, str | None]]:
        """The relayed run's records as the HTTP sink gives them: (id, arrival, received_at)."""
        received_at = relayed_received_at(self.database)
        return [(i, t, received_at.get(i)) for i, t in self.received()]

    async def wait(self, deadline: float) -> None:
        """Until the consumer stops, or ``deadline`` (monotonic)."""
        while not self.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def publish(
        self,
        messages: Sequence[tuple[str, bytes, dict[str, str]]],
        concurrency: int,
        deadline: float,
    ) -> Published:
        """The baseline: the kit publishes ``messages``; waits for the consumer to read them."""
        await self.reset(len(messages))
        cpu_started = time.process_time()
        started = time.time()
        confirms = await self.kit.publish(self.url, self.name, messages, concurrency)
        client_cpu_s = time.process_time() - cpu_started
        client_cpu = client_cpu_s / max(time.time() - started, 1e-9)
        await self.wait(deadline)
        return Published(
            len(messages), len(confirms), started, self.received(), client_cpu, client_cpu_s
        )

    def stop_consumer(self) -> None:
        if self.consumer is not None:
            stop(self.consumer)

    async def close(self) -> None:
        """Stop the consumer and delete what the run created on the broker."""
        self.stop_consumer()
        with contextlib.suppress(Exception):
            await self.kit.cleanup(self.url, self.name)
        if self.broker == "amqp":
            with contextlib.suppress(Exception):
                self.kit.drop_vhost(self.url)


def start_consumer(
    broker: str, url: str, name: str, count: int, idle_timeout: float, out: Path
) -> subprocess.Popen[bytes]:
    """``broker_consume.py`` reading ``name``'s messages into ``out`` (its log beside it)."""
    argv = [sys.executable, str(SCRIPTS / "broker_consume.py"), broker, url, name]
    argv += [str(count), str(idle_timeout), str(out)]
    with out.with_suffix(".log").open("wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()
            process.wait()


def relayed_received_at(database: Path) -> dict[str, str]:
    """Each stored event's ``received_at`` as ISO 8601 in UTC (SQLite keeps naive UTC text)."""
    if not database.exists():
        return {}
    with contextlib.closing(sqlite3.connect(database)) as conn:
        rows = conn.execute("SELECT id, received_at FROM received_events").fetchall()
    return {str(i): _utc_iso(str(at)) for i, at in rows}


def _utc_iso(text: str) -> str:
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


class BrokerOutage:
    """The chaos run's broker: one of the run's own, which the run takes down and brings back.

    NATS and MQTT: a private ``nats-server -js`` or Mosquitto (persistent) on a free port,
    stopped (SIGTERM) and started again on the same port and store. RabbitMQ: a vhost of the
    run's own on the machine's broker, made unusable (permissions cleared, connections closed)
    and usable again. Its consumer runs from before the traffic until it has seen every
    expected event (or none came for ``idle_timeout`` seconds), through the outages.
    """

    def __init__(self, broker: str, workdir: Path, port: int) -> None:
        self.broker = broker
        self.kit: ModuleType = importlib.import_module(f"broker_{broker}")
        self.name = f"chaos-{secrets.token_hex(4)}"
        self.workdir = workdir
        self.port = port
        self.server: subprocess.Popen[bytes] | None = None
        if broker == "amqp":
            self.url = self.kit.make_vhost(self.name)
        else:
            self.server = self.kit.start_server(workdir, port)
            self.url = f"{broker}://127.0.0.1:{port}"
        self.consumer: subprocess.Popen[bytes] | None = None
        self._out = workdir / "consumed.json"

    def table(self, header: str, **settings: str) -> str:
        """The relay's destination table, with ``settings`` (timeout, policy) added."""
        return toml_table(header, self.kit.destination(self.url, self.name) | settings)

    @property
    def what(self) -> str:
        return "RabbitMQ vhost" if self.broker == "amqp" else f"{self.broker} broker"

    async def start_consumer(self, count: int, idle_timeout: float) -> None:
        """An empty place and its consumer, waiting for ``count`` distinct events."""
        await self.kit.prepare(self.url, self.name)
        self.consumer = start_consumer(
            self.broker, self.url, self.name, count, idle_timeout, self._out
        )
        await asyncio.sleep(CONSUMER_READY_SECONDS)

    def down(self) -> str:
        """Take the broker away; says how."""
        if self.server is None:
            self.kit.break_access(self.url)
            return "permissions cleared, connections closed"
        self.kit.stop_server(self.server)
        return f"stopped (SIGTERM), port {self.port}"

    def up(self) -> str:
        """Bring it back; says how."""
        if self.server is None:
            self.kit.restore_access(self.url)
            return "permissions restored"
        self.server = self.kit.start_server(self.workdir, self.port)
        return f"started again on port {self.port}, same store"

    async def answers(self, deadline: float) -> list[list[Any]]:
        """What the consumer received, as the HTTP sink's answers: ``[webhook-id, arrival,
        None, 200, "ok"]``; waits for the consumer to stop, until ``deadline`` (monotonic)."""
        while self.consumer is not None and self.consumer.poll() is None:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        if not self._out.exists():
            return []
        received = json.loads(self._out.read_text("utf-8"))
        return [[str(i), float(t), None, 200, "ok"] for i, t in received]

    async def aclose(self) -> None:
        """Stop the consumer and the broker (or drop the vhost)."""
        if self.consumer is not None:
            stop(self.consumer)
        with contextlib.suppress(Exception):
            await self.kit.cleanup(self.url, self.name)
        if self.server is not None:
            self.kit.stop_server(self.server)
        elif self.broker == "amqp":
            with contextlib.suppress(Exception):
                self.kit.drop_vhost(self.url)
