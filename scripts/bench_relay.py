"""Relay benchmark: how fast callbacks get from the receivers to an HTTP destination, next to a
plain httpx baseline.

What is measured, in one run, one target after the other (never simultaneously): the
baseline, the relay, and the baseline again, so that a machine whose speed drifts during a run
meets both alike.

a) the baseline: this process POSTs the envelopes of the events (built with the relay's own
   ``envelope_bytes``, the same headers a destination sends) straight to the sink with the
   very httpx client a worker's HTTP destinations use (``new_http_client``: the same pools in
   shards, limits and cookie handling), ``--concurrency`` requests in flight, on the event
   loop `relay worker` runs on by default (uvloop where it is installed);
b) the relay: the events are POSTed to the receivers (``relay serve`` on a fresh SQLite database
   in WAL mode in a temp directory) by the lean keep-alive load generator of ``benchlib.py``
   (``--ingest-concurrency`` connections); the receivers store them, route them to the one
   destination ``[destinations.sink]`` (type http, format envelope, ``ordering = --ordering``)
   and enqueue arq jobs on the machine's Redis (``redis://127.0.0.1:6379/<--redis-db>``,
   flushed at the start, between relay runs and at the end); ONE ``relay worker``
   (``worker_concurrency = --concurrency``) POSTs them to the sink.

With ``--ordering per-key`` the relay runs three times on the same events, each time with a
fresh database and fresh serve and worker processes: ``ordering = "none"``, ``"per-key"``,
``"none"`` (so the order is: baseline, none, per-key, none, baseline).

The sink is ``scripts/sink_app.py`` under uvicorn (one worker, its own process): for each request
it records the ``webhook-id`` header and the arrival time (``time.time()``, wall-clock UTC, the
same clock as the envelope's ``received_at``, which the receivers take with
``datetime.now(UTC)`` on this machine).

The events: by default ``build_events`` of ``benchlib.py`` (a mix of kinds, each event its own
platform id). With ``--keys N`` they share N platform ids: event i has key i % N (a uuid per
key) in its platform-id field (``requestId`` of an SMS report, ``messageId`` of a Conversations
status, ``callId`` of a call event). The receivers deduplicate on the platform id and, where the
kind has one, a status or event name; so that each event stays a new event, the events are drawn
only from the mix's kinds with such a second field (SMS reports, Conversations statuses, call
events: an inbound SMS or a number lookup is keyed by its ``requestId`` alone), and that field
gets the event's place in its key's line as a suffix (``DELIVERED-41``). The runs compared get
the very same events.

Figures:

- deliveries/s: (a) answered POSTs / (last arrival at the sink - first POST);
  (b) events that reached the sink / (last first-arrival at the sink - first POST to the
  receivers), so it includes ingest, routing, queueing and delivery;
- ratio = (b) / the mean of the two runs of (a) (with ``--ordering per-key``: the per-key run's);
- ordering_ratio (``--ordering per-key`` only) = the per-key run's deliveries/s / the mean of
  the two ``none`` runs';
- lag per event (b): first arrival at the sink - the envelope's ``received_at``, p50/p99 in ms
  (for (a), send -> arrival, printed for reference);
- out_of_order (b): events whose first arrival at the sink came before the first arrival of an
  event of the same order key that the receivers received earlier (``received_at``, ties broken
  by the event id, as the relay orders a key's line). The key of each event is its platform id
  (``relay.outbox.order_keys.platform_id`` of the payload this script generated), mapped to the
  event id by the receivers' acknowledgement of that request; ``received_at`` is the envelope's, as
  the sink saw it. Must be 0 with ``ordering = "per-key"``; informative with ``none`` (and 0
  whenever every event has a key of its own);
- lost: events the receivers acknowledged (200 with their id) that the sink never saw (by
  ``webhook-id``) within ``--drain-timeout`` seconds after the last acknowledgement. Must be 0.

Also printed: the ingest rate, the relay-only rate (first to last arrival), duplicates at the
sink, CPU use of each process during (b) (from /proc; near 1.0 = that process is CPU-bound), the
baseline client's own CPU use and the deliveries' statuses in SQL. ``--profile DIR`` runs serve
and worker under cProfile (for hot spots only: it slows them down).

The exit status is 1 when events were lost or not acknowledged, or a per-key run delivered out
of order, 2 when the run itself failed (a process did not start, ``--timeout`` expired). Every
subprocess is stopped, the Redis database flushed and the temp directory removed on every path.

With ``--destination amqp|nats|mqtt`` the destination is the machine's RabbitMQ (a vhost of the
run's own), NATS JetStream (a stream of the run's own) or Mosquitto (a topic of the run's own),
and the sink is the broker's own consumer in a process of its own (``broker_consume.py``). The
baseline (a) is then the broker's own client publishing the same messages, ``--concurrency``
awaiting their confirmation at once, with the destination's confirmation mode (publisher
confirms, JetStream acks, QoS 1 PUBACKs); its deliveries/s count until the consumer's last
arrival, and it has no lag figure. See ``broker_bench.py``. (``--ordering per-key`` is for the
HTTP destination only.)

Run it with the project's interpreter (needs the project installed and Redis on 127.0.0.1:6379)::

    python scripts/bench_relay.py [--json] [--events 5000] [--concurrency 50]
        [--destination http|amqp|nats|mqtt] [--ordering none|per-key] [--keys N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis
import redis.asyncio
from arq.constants import health_check_key_suffix
from benchlib import (
    HOST,
    KIND_MIX,
    POLL_INTERVAL_SECONDS,
    READY_TIMEOUT_SECONDS,
    STOP_GRACE_SECONDS,
    BenchError,
    Event,
    Server,
    at_least,
    bounded,
    build_events,
    close_connections,
    drive,
    encode_requests,
    free_port,
    loop_factory,
    open_connections,
    relay_argv,
    relay_command,
    relay_env,
    sigterm_interrupts,
    start_server,
    stop_server,
    uvicorn_argv,
    wait_ready,
)
from broker_bench import BROKERS, BrokerSink, toml_table

from receivers.dedup import platform_refs_of
from receivers.event_loop import loop_factory as worker_loop_factory
from relay.destinations.http import USER_AGENT, new_http_client
from relay.destinations.message_headers import MessageHeaders
from relay.destinations.outbound import JSON_CONTENT_TYPE, Outbound, envelope_bytes
from relay.dispatch.jobs import QUEUE_NAME
from relay.server.services import HTTP_LIMITS
from relay.simulator import factories

REDIS_PORT = 6379
SINK_PATH = "/relay"
SOURCE = "default"
WORKER_HEALTH_KEY = QUEUE_NAME + health_check_key_suffix  # set by arq after on_startup
# The worker's HTTP pool (relay.server.services.worker_services); the baseline uses the same limits.
SETTLE_SECONDS = 10.0  # untimed wait for the deliveries' statuses in SQL to become final
RECORDS_MARGIN_SECONDS = 10.0  # kept from the overall --timeout to fetch the records and report
KIND_BY_PATH = {
    "/sms/dlr": "sms.dlr",
    "/sms/inbound": "sms.inbound",
    "/numinfo/gnp": "numinfo.gnp",
    "/conversations": "conversations.status",  # KIND_MIX only sends MessageStatus events there
    "/tts/events": "tts.event",
}
ORDERINGS = ("none", "per-key")
# --keys: the mix's kinds whose dedup key has a second field besides the platform id, and the
# names of both fields (an inbound SMS and a number lookup are keyed by their requestId alone:
# two of them with one requestId would be one event to the receivers).
KEYED_FIELDS = {
    "/sms/dlr": ("requestId", "status"),
    "/conversations": ("messageId", "event"),
    "/tts/events": ("callId", "status"),
}


# --- events --------------------------------------------------------------------------------------


def build_keyed_events(count: int, seed: int, keys: int) -> list[Event]:
    """``count`` distinct callbacks sharing ``keys`` platform ids: event i has key i % keys.

    Drawn from the kinds of :data:`KEYED_FIELDS` with their weights in ``KIND_MIX``; the second
    dedup field (status, event name) gets the event's place in its key's line as a suffix, so
    that the receivers take each one for a new event."""
    rng = random.Random(seed)
    mix = [entry for entry in KIND_MIX if entry[0] in KEYED_FIELDS]
    picks = rng.choices(mix, weights=[weight for _, weight, _ in mix], k=count)
    key_rng = random.Random(f"{seed}/keys")
    names = [
        str(uuid.UUID(int=key_rng.getrandbits(128), version=4)) for _ in range(min(keys, count))
    ]
    events = []
    for number, (path, _, make) in enumerate(picks):
        payload = make(rng)
        key_field, name_field = KEYED_FIELDS[path]
        key = names[number % keys]
        overrides = {key_field: key, name_field: f"{payload[name_field]}-{number // keys}"}
        if isinstance(payload.get("href"), str):  # an SMS report's link names its requestId
            overrides["href"] = payload["href"].replace(payload[key_field], key)
        body = json.dumps(factories.apply_overrides(payload, overrides)).encode()
        events.append(Event(path, body))
    if len({event.body for event in events}) != count:
        raise BenchError("the keyed events are not all distinct")
    return events


def order_keys(events: Sequence[Event]) -> list[str | None]:
    """The order key of each event at a destination with the default ``order_key``: its
    platform id (None: it has none, and is delivered without waiting for any other)."""
    return [
        platform_refs_of(KIND_BY_PATH[event.path], json.loads(event.body))[0] for event in events
    ]


# --- results -----------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(1, math.ceil(fraction * len(sorted_values))) - 1]


@dataclass
class Arrivals:
    """The sink's records, reduced to the first arrival of each webhook-id."""

    first: dict[str, float]
    received_at: dict[str, float]
    requests: int

    @classmethod
    def from_records(cls, rows: Sequence[Sequence[Any]]) -> Arrivals:
        first: dict[str, float] = {}
        received: dict[str, float] = {}
        for webhook_id, arrived, received_at in rows:
            if webhook_id in first:
                continue
            first[webhook_id] = float(arrived)
            if isinstance(received_at, str):
                with contextlib.suppress(ValueError):
                    received[webhook_id] = datetime.fromisoformat(received_at).timestamp()
        return cls(first, received, len(rows))

    @property
    def duplicates(self) -> int:
        return self.requests - len(self.first)

    def out_of_order(self, key_of: dict[str, str]) -> int:
        """Events that first arrived before an event of their key received earlier (by
        ``received_at``, then the event id); events without a key or a time do not count."""
        lines: dict[str, list[tuple[float, str, float]]] = defaultdict(list)
        for event_id, key in key_of.items():
            if event_id in self.first and event_id in self.received_at:
                lines[key].append((self.received_at[event_id], event_id, self.first[event_id]))
        count = 0
        for line in lines.values():
            line.sort()
            latest = -math.inf  # the latest first arrival of the events received before
            for _, _, arrived in line:
                if arrived < latest:
                    count += 1
                else:
                    latest = arrived
        return count


@dataclass
class Baseline:
    """(a): httpx straight to the sink."""

    requests: int
    ok: int
    started: float
    last_arrival: float
    lag_p50_ms: float
    lag_p99_ms: float
    client_cpu: float  # this process's CPU time / elapsed: near 1.0, httpx itself is the limit

    @property
    def dps(self) -> float:
        elapsed = self.last_arrival - self.started
        return self.ok / elapsed if elapsed > 0 else 0.0


@dataclass
class Relayed:
    """(b): receivers -> SQL -> Redis -> worker -> sink."""

    events: int
    acked: int
    delivered: int
    lost: int
    duplicates: int
    started: float
    acked_at: float
    first_arrival: float
    last_arrival: float
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    lag_missing: int
    cpu: dict[str, float]
    ordering: str
    out_of_order: int
    deliveries: dict[str, int] = field(default_factory=dict)

    @property
    def dps(self) -> float:
        elapsed = self.last_arrival - self.started
        return self.delivered / elapsed if elapsed > 0 else 0.0

    @property
    def ingest_eps(self) -> float:
        elapsed = self.acked_at - self.started
        return self.acked / elapsed if elapsed > 0 else 0.0

    @property
    def relay_only_dps(self) -> float:
        elapsed = self.last_arrival - self.first_arrival
        return (self.delivered - 1) / elapsed if elapsed > 0 and self.delivered > 1 else 0.0

    @property
    def failed(self) -> bool:
        """Events lost or not acknowledged, or a per-key run out of order."""
        wrong_order = self.ordering == "per-key" and self.out_of_order > 0
        return self.lost > 0 or self.acked < self.events or wrong_order

    def as_json(self) -> dict[str, Any]:
        """The figures of one relay run (for ``runs`` in the JSON report)."""
        return {
            "ordering": self.ordering,
            "dps": round(self.dps, 1),
            "lag_p50_ms": round(self.lag_p50_ms, 1),
            "lag_p99_ms": round(self.lag_p99_ms, 1),
            "out_of_order": self.out_of_order,
            "lost": self.lost,
            "acked": self.acked,
            "delivered": self.delivered,
            "duplicates": self.duplicates,
            "ingest_eps": round(self.ingest_eps, 1),
            "relay_only_dps": round(self.relay_only_dps, 1),
            "cpu": {name: round(s, 2) for name, s in self.cpu.items() if not math.isnan(s)},
            "deliveries": self.deliveries,
        }


@dataclass
class Report:
    args: argparse.Namespace
    baseline: Baseline
    relayed: Relayed
    """The relay's run with ``--ordering``."""
    baseline_after: Baseline
    unordered: list[Relayed] = field(default_factory=list)
    """With ``--ordering per-key``: the runs with ``ordering = "none"`` before and after it."""

    @property
    def runs(self) -> list[Relayed]:
        """Every relay run, in the order they ran."""
        return [*self.unordered[:1], self.relayed, *self.unordered[1:]]

    @property
    def none_dps(self) -> float:
        """The mean deliveries/s of the ``none`` runs around the per-key one."""
        return sum(r.dps for r in self.unordered) / len(self.unordered) if self.unordered else 0.0

    @property
    def ordering_ratio(self) -> float:
        return self.relayed.dps / self.none_dps if self.none_dps else 0.0

    @property
    def baseline_dps(self) -> float:
        """The mean of the baseline's runs before and after the relay's."""
        return (self.baseline.dps + self.baseline_after.dps) / 2

    @property
    def baseline_label(self) -> str:
        destination = self.args.destination
        return "httpx -> sink" if destination == "http" else f"{destination} client -> consumer"

    @property
    def ratio(self) -> float:
        return self.relayed.dps / self.baseline_dps if self.baseline_dps else 0.0

    @property
    def failed(self) -> bool:
        return any(run.failed for run in self.runs)

    def as_json(self) -> dict[str, Any]:
        b, r = self.baseline, self.relayed
        ordering: dict[str, Any] = {
            "ordering": r.ordering,
            "keys": self.args.keys,
            "out_of_order": r.out_of_order,
        }
        if self.unordered:
            ordering |= {
                "ordering_ratio": round(self.ordering_ratio, 3),
                "dps_per_key": round(r.dps, 1),
                "dps_none": round(self.none_dps, 1),
                "dps_none_before": round(self.unordered[0].dps, 1),
                "dps_none_after": round(self.unordered[-1].dps, 1),
                "out_of_order_none": [run.out_of_order for run in self.unordered],
                "lost_none": [run.lost for run in self.unordered],
            }
        return ordering | {
            "baseline_dps": round(self.baseline_dps, 1),
            "baseline_dps_before": round(b.dps, 1),
            "baseline_dps_after": round(self.baseline_after.dps, 1),
            "dps": round(r.dps, 1),
            "ratio": round(self.ratio, 3),
            "lag_p50_ms": round(r.lag_p50_ms, 1),
            "lag_p99_ms": round(r.lag_p99_ms, 1),
            "lost": r.lost,
            "events": r.events,
            "acked": r.acked,
            "delivered": r.delivered,
            "duplicates": r.duplicates,
            "lag_max_ms": round(r.lag_max_ms, 1),
            "ingest_eps": round(r.ingest_eps, 1),
            "ingest_s": round(r.acked_at - r.started, 3),
            "total_s": round(r.last_arrival - r.started, 3),
            "drain_after_last_ack_s": round(r.last_arrival - r.acked_at, 3),
            "relay_only_dps": round(r.relay_only_dps, 1),
            "lag_missing": r.lag_missing,
            "baseline_errors": b.requests - b.ok,
            "baseline_lag_p50_ms": None if math.isnan(b.lag_p50_ms) else round(b.lag_p50_ms, 2),
            "baseline_lag_p99_ms": None if math.isnan(b.lag_p99_ms) else round(b.lag_p99_ms, 2),
            "baseline_client_cpu": round(b.client_cpu, 2),
            "cpu": {name: round(s, 2) for name, s in r.cpu.items() if not math.isnan(s)},
            "deliveries": r.deliveries,
            "destination": self.args.destination,
            "concurrency": self.args.concurrency,
            "ingest_concurrency": self.args.ingest_concurrency,
            "runs": [run.as_json() for run in self.runs],
        }

    def as_text(self) -> str:
        b, r = self.baseline, self.relayed
        cpu = ", ".join(
            f"{name} {share:.0%}" for name, share in r.cpu.items() if not math.isnan(share)
        )
        statuses = ", ".join(f"{status} {n}" for status, n in sorted(r.deliveries.items()))
        count = self.args.keys
        keys = "each its own key" if count is None else f"{count} key{'s' if count > 1 else ''}"
        lines = [
            f"relay benchmark ({self.args.destination}): {r.events} events ({keys}), "
            f"worker_concurrency {self.args.concurrency}, "
            f"{self.args.ingest_concurrency} ingest connections, ordering {r.ordering}",
            f"{'target':<26} {'deliveries/s':>12} {'lag p50 ms':>11} {'lag p99 ms':>11}",
            f"{'a) ' + self.baseline_label:<26} {self.baseline_dps:>12.1f} "
            f"{ms(b.lag_p50_ms):>11} "
            f"{ms(b.lag_p99_ms):>11}   (mean of {b.dps:.0f} before and "
            f"{self.baseline_after.dps:.0f} after b); lag: send -> arrival; client cpu "
            f"{b.client_cpu:.0%})",
        ]
        for run in self.runs:
            label = (
                "b) serve+worker -> sink" if not self.unordered else f"b) ordering {run.ordering}"
            )
            lines.append(
                f"{label:<26} {run.dps:>12.1f} {run.lag_p50_ms:>11.1f} "
                f"{run.lag_p99_ms:>11.1f}   (lag: received_at -> arrival; max "
                f"{run.lag_max_ms:.0f}; out of order {run.out_of_order}; lost {run.lost})"
            )
        lines.append(f"ratio b/a: {self.ratio:.3f}")
        if self.unordered:
            none = " and ".join(f"{run.dps:.0f}" for run in self.unordered)
            lines.append(
                f"ordering_ratio per-key/none: {self.ordering_ratio:.3f} (per-key {r.dps:.0f}, "
                f"none {self.none_dps:.0f}: mean of {none})"
            )
        lines += [
            f"out_of_order: {r.ordering} {r.out_of_order}"
            + "".join(f", none {run.out_of_order}" for run in self.unordered),
            f"ingest ({r.ordering}): {r.acked}/{r.events} acked in {r.acked_at - r.started:.2f} s "
            f"({r.ingest_eps:.0f} events/s); last arrival {r.last_arrival - r.acked_at:.2f} s "
            f"after the last ack; relay-only rate {r.relay_only_dps:.0f}/s",
            f"cpu during b) {r.ordering} (1.0 = one core): {cpu}",
            f"deliveries in SQL ({r.ordering}): {statuses or 'unknown'}",
            f"lost: {r.lost} (delivered {r.delivered}, duplicates at the sink {r.duplicates}, "
            f"baseline errors {b.requests - b.ok})"
            + "".join(f"; none: lost {run.lost}" for run in self.unordered[:1])
            + "".join(f", {run.lost}" for run in self.unordered[1:]),
        ]
        return "\n".join(lines)


def ms(value: float) -> str:
    """A latency for the text report ("-" when there is none, as for a broker's baseline)."""
    return "-" if math.isnan(value) else f"{value:.1f}"


# --- the sink ------------------------------------------------------------------------------------


class Sink:
    """Control calls to the sink subprocess."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.base = f"http://{HOST}:{server.port}"
        self.url = self.base + SINK_PATH

    async def reset(self, client: httpx.AsyncClient) -> None:
        (await client.post(self.base + "/_bench/reset")).raise_for_status()

    async def distinct(self, client: httpx.AsyncClient) -> int:
        response = await client.get(self.base + "/_bench/count")
        response.raise_for_status()
        return int(response.json()["distinct"])

    async def arrivals(self, client: httpx.AsyncClient) -> Arrivals:
        response = await client.get(self.base + "/_bench/records", timeout=60)
        response.raise_for_status()
        return Arrivals.from_records(response.json())


def control_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=10, trust_env=False)


# --- a) baseline -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """A pre-built baseline request: the envelope body and the destination's headers."""

    id: str
    body: bytes
    headers: dict[str, str]
    message_headers: dict[str, str]
    """The headers of a broker destination's message (no signing secret)."""


def build_envelopes(events: Sequence[Event]) -> list[Envelope]:
    """The envelopes of the events, as an HttpDestination renders them (no signing secret)."""
    now = datetime.now(UTC)
    timestamp = str(int(now.timestamp()))
    envelopes = []
    for number, event in enumerate(events):
        event_id = f"baseline-{number:08d}"
        outbound = Outbound(
            event_id=event_id,
            kind=KIND_BY_PATH[event.path],
            source=SOURCE,
            received_at=now,
            payload=json.loads(event.body),
            raw_body=event.body,
            content_type=JSON_CONTENT_TYPE,
            method="POST",
        )
        headers = {
            "user-agent": USER_AGENT,
            "content-type": JSON_CONTENT_TYPE,
            "webhook-id": event_id,
            "webhook-timestamp": timestamp,
        }
        body = envelope_bytes(outbound)
        message_headers = MessageHeaders([]).for_message(outbound, body, JSON_CONTENT_TYPE)
        envelopes.append(Envelope(event_id, body, headers, message_headers))
    return envelopes


async def run_baseline(sink: Sink, envelopes: Sequence[Envelope], concurrency: int) -> Baseline:
    """POST every envelope to the sink, ``concurrency`` at a time, with one httpx client."""
    await wait_ready(sink.server, "/_bench/healthz")
    async with control_client() as control:
        await sink.reset(control)
    sent_at = [0.0] * len(envelopes)
    statuses = [0] * len(envelopes)
    indexes = iter(range(len(envelopes)))

    async with new_http_client(limits=HTTP_LIMITS) as client:  # the worker's very client

        async def sender() -> None:
            for index in indexes:
                envelope = envelopes[index]
                sent_at[index] = time.time()
                try:
                    response = await client.post(
                        sink.url, content=envelope.body, headers=envelope.headers
                    )
                except httpx.HTTPError:
                    continue
                statuses[index] = response.status_code

        cpu_started = time.process_time()
        started = time.time()
        await asyncio.gather(*(sender() for _ in range(concurrency)))
        client_cpu = (time.process_time() - cpu_started) / max(time.time() - started, 1e-9)

    async with control_client() as control:
        arrivals = await sink.arrivals(control)
    ok = [i for i, status in enumerate(statuses) if 200 <= status < 300]
    lags = sorted(
        (arrivals.first[envelopes[i].id] - sent_at[i]) * 1000
        for i in ok
        if envelopes[i].id in arrivals.first
    )
    return Baseline(
        requests=len(envelopes),
        ok=len(ok),
        started=started,
        last_arrival=max(arrivals.first.values(), default=started),
        lag_p50_ms=percentile(lags, 0.50),
        lag_p99_ms=percentile(lags, 0.99),
        client_cpu=client_cpu,
    )


async def run_broker_baseline(
    sink: BrokerSink, envelopes: Sequence[Envelope], concurrency: int, deadline: float
) -> Baseline:
    """The broker's own client publishes every envelope; its consumer reads them back."""
    messages = [(e.id, e.body, e.message_headers) for e in envelopes]
    run = await sink.publish(messages, concurrency, deadline)
    arrivals = Arrivals.from_records([(i, t, None) for i, t in run.received])
    return Baseline(
        requests=run.sent,
        ok=run.confirmed,
        started=run.started,
        last_arrival=max(arrivals.first.values(), default=run.started),
        lag_p50_ms=math.nan,
        lag_p99_ms=math.nan,
        client_cpu=run.client_cpu,
    )


# --- b) the relay --------------------------------------------------------------------------------


def redis_url(database: int) -> str:
    return f"redis://{HOST}:{REDIS_PORT}/{database}"


def flush_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        client.flushdb()
    finally:
        client.close()


def http_table(sink_url: str, ordering: str) -> str:
    """The ``[destinations.sink]`` table of the HTTP sink."""
    table = {"type": "http", "url": sink_url, "format": "envelope", "ordering": ordering}
    return toml_table("destinations.sink", table)


def write_config(workdir: Path, token: str, args: argparse.Namespace, destination: str) -> Path:
    """The relay's settings, with ``destination`` (a ``[destinations.sink]`` table)."""
    config = workdir / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{workdir / "relay.db"}"\n'
        f'redis_url = "{redis_url(args.redis_db)}"\n'
        f"worker_concurrency = {args.concurrency}\n"
        f'sweep_interval = "{args.sweep_interval}"\n'
        "\n"
        f'[sources.{SOURCE}]\ntoken = "{token}"\n'
        "\n" + destination,
        encoding="utf-8",
    )
    return config


async def wait_worker(worker: Server, url: str) -> None:
    """Until arq has run the worker's start-up (it then writes its health-check key)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if worker.process.poll() is not None:
                raise BenchError(f"{worker.name} exited early:\n{worker.log_tail()}")
            if await client.exists(WORKER_HEALTH_KEY):
                return
            await asyncio.sleep(POLL_INTERVAL_SECONDS)
    finally:
        await client.aclose()
    raise BenchError(f"{worker.name} did not start in time:\n{worker.log_tail()}")


def profiled(argv: list[str], directory: Path | None, name: str) -> list[str]:
    """``argv`` under cProfile, writing ``directory/name.prof`` when the process exits."""
    if directory is None:
        return argv
    if not Path(argv[0]).is_file() or argv[0] == sys.executable:
        raise BenchError("--profile needs the `relay` console script next to this interpreter")
    output = directory.resolve() / f"{name}.prof"
    return [sys.executable, "-m", "cProfile", "-o", str(output), *argv]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def acked_ids(statuses: Sequence[int], bodies: Sequence[bytes]) -> list[str | None]:
    """The event id each request was acknowledged with, by request (None: no 2xx with an id)."""
    ids: list[str | None] = []
    for status, body in zip(statuses, bodies, strict=True):
        event_id = None
        if 200 <= status < 300:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                event_id = str(json.loads(body)["id"])
        ids.append(event_id)
    return ids


async def run_relay(
    args: argparse.Namespace,
    workdir: Path,
    events: Sequence[Event],
    keys: Sequence[str | None],
    sink: Sink | BrokerSink,
    servers: list[Server],
    deadline: float,
    ordering: str,
    profile_suffix: str = "",
) -> Relayed:
    """Start `relay serve` and one `relay worker` (destination ``ordering`` as given), push the
    events in, wait for them at the sink. ``keys``: each event's order key. The processes are
    added to ``servers``; the caller stops them."""
    token = secrets.token_urlsafe(24)
    table = sink.table() if isinstance(sink, BrokerSink) else http_table(sink.url, ordering)
    config = write_config(workdir, token, args, table)
    port = free_port()
    argv = profiled(relay_argv(port, config), args.profile, "serve" + profile_suffix)
    serve = start_server("serve", argv, port, workdir, relay_env())
    servers.append(serve)
    await wait_ready(serve, "/readyz")  # SQLite is migrated before it answers
    worker_argv = [*relay_command(), "worker", "--config", str(config)]
    argv = profiled(worker_argv, args.profile, "worker" + profile_suffix)
    worker = start_server("worker", argv, 0, workdir, relay_env())
    servers.append(worker)
    await wait_worker(worker, redis_url(args.redis_db))

    async with control_client() as control:
        if isinstance(sink, BrokerSink):
            await sink.reset(len(events))
        else:
            await sink.reset(control)
        requests = encode_requests(events, port, token, user_agent="bench-relay")
        connections = await open_connections(port, args.ingest_concurrency)
        processes = {"serve": serve.process.pid, "worker": worker.process.pid}
        processes["sink"] = sink.pid if isinstance(sink, BrokerSink) else sink.server.process.pid
        cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        bench_cpu_before = time.process_time()
        started = time.time()
        try:
            phase = await drive(connections, requests, keep_bodies=True)
        finally:
            close_connections(connections)
        acked_at = time.time()
        ids = acked_ids(phase.statuses, phase.bodies)
        acked = [event_id for event_id in ids if event_id is not None]

        # Bounded wait: until the sink has seen as many distinct ids as were acked.
        limit = min(time.monotonic() + args.drain_timeout, deadline - RECORDS_MARGIN_SECONDS)
        while time.monotonic() < limit:
            if isinstance(sink, BrokerSink):
                if sink.done():
                    break
            elif await sink.distinct(control) >= len(acked):
                break
            if worker.process.poll() is not None:
                print(f"warning: the worker exited:\n{worker.log_tail()}", file=sys.stderr)
                break
            await asyncio.sleep(POLL_INTERVAL_SECONDS)
        ended = time.time()
        cpu_after = {name: cpu_seconds(pid) for name, pid in processes.items()}
        bench_cpu = time.process_time() - bench_cpu_before
        if isinstance(sink, BrokerSink):
            arrivals = Arrivals.from_records(sink.records())
        else:
            arrivals = await sink.arrivals(control)
    # Untimed: let the worker record its last attempts, so that the statuses in SQL are final.
    await settle(workdir / "relay.db", min(time.monotonic() + SETTLE_SECONDS, limit))
    cpu = {name: (cpu_after[name] - cpu_before[name]) / (ended - started) for name in processes}
    cpu["bench"] = bench_cpu / (ended - started)

    delivered = [event_id for event_id in acked if event_id in arrivals.first]
    lags = sorted(
        (arrivals.first[event_id] - arrivals.received_at[event_id]) * 1000
        for event_id in delivered
        if event_id in arrivals.received_at
    )
    times = [arrivals.first[event_id] for event_id in delivered]
    key_of = {
        event_id: key
        for event_id, key in zip(ids, keys, strict=True)
        if event_id is not None and key is not None
    }
    return Relayed(
        events=len(events),
        acked=len(acked),
        delivered=len(delivered),
        lost=len(set(acked) - set(delivered)),
        duplicates=arrivals.duplicates,
        started=started,
        acked_at=acked_at,
        first_arrival=min(times, default=started),
        last_arrival=max(times, default=started),
        lag_p50_ms=percentile(lags, 0.50),
        lag_p99_ms=percentile(lags, 0.99),
        lag_max_ms=lags[-1] if lags else math.nan,
        lag_missing=len(delivered) - len(lags),
        cpu=cpu,
        ordering=ordering,
        out_of_order=arrivals.out_of_order(key_of),
    )


async def settle(database: Path, deadline: float) -> None:
    """Until no delivery is pending in SQL (read-only, WAL readers do not block the writers)."""
    while time.monotonic() < deadline:
        counts = await asyncio.to_thread(delivery_counts, database)
        if counts and not counts.get("pending"):
            return
        await asyncio.sleep(POLL_INTERVAL_SECONDS)


def delivery_counts(database: Path) -> dict[str, int]:
    """Deliveries per status (empty when the database cannot be read)."""
    if not database.exists():
        return {}
    try:
        with contextlib.closing(sqlite3.connect(database)) as conn:
            query = "SELECT status, count(*) FROM deliveries GROUP BY status"
            return {status: count for status, count in conn.execute(query)}
    except sqlite3.Error:
        return {}


# --- the whole run -------------------------------------------------------------------------------


def stop_all(servers: list[Server], *, interrupt: bool = False) -> None:
    """Stop the subprocesses, the last started first; ``interrupt``: SIGINT first (a process
    under cProfile writes its profile on KeyboardInterrupt, not when killed by SIGTERM)."""
    for server in reversed(servers):
        if interrupt and server.process.poll() is None:
            server.process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.process.wait(timeout=STOP_GRACE_SECONDS)
        try:
            status = stop_server(server)
        except Exception as exc:  # keep stopping the others
            print(f"warning: stopping {server.name} failed: {exc}", file=sys.stderr)
            continue
        if status not in (0, -signal.SIGTERM, -signal.SIGINT):
            print(f"warning: {server.name} exited with status {status}", file=sys.stderr)
            if os.environ.get("BENCH_RELAY_DEBUG"):
                print(server.log_tail(), file=sys.stderr)
    servers.clear()


def run(args: argparse.Namespace, workdir: Path) -> Report:
    deadline = time.monotonic() + args.timeout
    if args.keys is None:
        events = build_events(args.events, args.seed)
    else:
        events = build_keyed_events(args.events, args.seed, args.keys)
    keys = order_keys(events)
    envelopes = build_envelopes(events)
    url = redis_url(args.redis_db)
    # With per-key ordering: none, per-key, none, each on a database and processes of its own.
    orderings = ["none", "per-key", "none"] if args.ordering == "per-key" else [args.ordering]
    servers: list[Server] = []
    sink: Sink | BrokerSink | None = None
    runs: list[Relayed] = []
    with sigterm_interrupts():
        try:
            try:
                flush_redis(url)
            except redis.RedisError as exc:
                raise BenchError(f"Redis at {url} is not usable: {exc}") from None
            sink = open_sink(args.destination, workdir, servers)
            baseline = measure_baseline(sink, envelopes, args.concurrency, deadline)
            for number, ordering in enumerate(orderings, 1):
                rundir, suffix = workdir, ""
                if len(orderings) > 1:
                    suffix = f"-{number}-{ordering}"
                    rundir = workdir / f"run{suffix}"
                    rundir.mkdir()
                relay_servers: list[Server] = []
                try:
                    # b) the load generator on uvloop (when installed), as bench_ingest drives it
                    with asyncio.Runner(loop_factory=loop_factory()) as runner:
                        relayed = runner.run(
                            bounded(
                                run_relay(
                                    args,
                                    rundir,
                                    events,
                                    keys,
                                    sink,
                                    relay_servers,
                                    deadline,
                                    ordering,
                                    suffix,
                                ),
                                deadline,
                            )
                        )
                finally:
                    stop_all(relay_servers, interrupt=args.profile is not None)
                relayed.deliveries = delivery_counts(rundir / "relay.db")
                runs.append(relayed)
                flush_redis(url)  # the next worker starts on an empty queue
            baseline_after = measure_baseline(sink, envelopes, args.concurrency, deadline)
        finally:
            stop_all(servers, interrupt=args.profile is not None)
            with contextlib.suppress(redis.RedisError):
                flush_redis(url)
            if isinstance(sink, BrokerSink):
                asyncio.run(sink.close())
    if len(runs) > 1:
        return Report(args, baseline, runs[1], baseline_after, [runs[0], runs[2]])
    return Report(args, baseline, runs[0], baseline_after)


def open_sink(destination: str, workdir: Path, servers: list[Server]) -> Sink | BrokerSink:
    """The HTTP sink (a subprocess added to ``servers``) or a broker's consumer."""
    if destination in BROKERS:
        return BrokerSink(destination, workdir, workdir / "relay.db")
    sink_port = free_port()
    sink_server = start_server(
        "sink", uvicorn_argv("sink_app:app", sink_port), sink_port, workdir, relay_env()
    )
    servers.append(sink_server)
    return Sink(sink_server)


def measure_baseline(
    sink: Sink | BrokerSink, envelopes: Sequence[Envelope], concurrency: int, deadline: float
) -> Baseline:
    """(a), on the event loop `relay worker` runs on by default (``--loop auto``)."""
    with asyncio.Runner(loop_factory=worker_loop_factory("auto")) as runner:
        if isinstance(sink, BrokerSink):
            return runner.run(
                bounded(run_broker_baseline(sink, envelopes, concurrency, deadline), deadline)
            )
        return runner.run(bounded(run_baseline(sink, envelopes, concurrency), deadline))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=at_least(1), default=5000, help="events per target")
    parser.add_argument(
        "--concurrency",
        type=at_least(1),
        default=50,
        help="worker_concurrency of the relay worker, and the baseline's requests in flight",
    )
    parser.add_argument(
        "--ingest-concurrency",
        type=at_least(1),
        default=None,
        help="keep-alive connections POSTing to the receivers (default: --concurrency)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="overall limit, seconds")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="how long to wait after the last ack for every event to reach the sink, seconds",
    )
    parser.add_argument(
        "--redis-db", type=int, default=12, help="Redis database on 127.0.0.1:6379 (flushed!)"
    )
    parser.add_argument("--sweep-interval", default="5s", help="the relay's sweep_interval")
    parser.add_argument("--seed", type=int, default=20260101, help="payload generator seed")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run serve and worker under cProfile, writing DIR/serve.prof and DIR/worker.prof "
        "(with --ordering per-key: DIR/serve-1-none.prof, DIR/worker-2-per-key.prof, ... one "
        "pair per relay run; slows them down: for finding hot spots, not for figures)",
    )
    parser.add_argument(
        "--destination",
        choices=("http", *BROKERS),
        default="http",
        help="http: the HTTP sink; amqp, nats, mqtt: the machine's broker, read back by its own "
        "consumer (default: http)",
    )
    parser.add_argument(
        "--ordering",
        choices=ORDERINGS,
        default="none",
        help="the destination's ordering; per-key also runs the relay with none before and "
        "after it on the same events and prints ordering_ratio = per-key deliveries/s / the "
        "mean of none's (default: none)",
    )
    parser.add_argument(
        "--keys",
        type=at_least(1),
        default=None,
        metavar="N",
        help="the events share N platform ids (event i gets key i %% N; drawn from the kinds "
        "that can repeat a platform id: SMS reports, Conversations statuses, call events); "
        "default: every event its own platform id, from the full mix",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.ingest_concurrency is None:
        args.ingest_concurrency = args.concurrency
    if args.ordering != "none" and args.destination != "http":
        parser.error("--ordering per-key is for --destination http only")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        try:
            report = run(args, Path(tmp))
        except BenchError as exc:
            print(f"bench_relay: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: everything has been stopped by now
            print("bench_relay: interrupted", file=sys.stderr)
            return 130
    print(json.dumps(report.as_json()) if args.json else report.as_text())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
