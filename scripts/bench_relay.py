"""Relay benchmark: how fast callbacks get from the receivers to a destination, next to a plain
client's baseline, in one run: the baseline, the relay, the baseline again (so that a machine
whose speed drifts meets both alike).

a) baseline: the events' envelopes (the documented format, ``received_at`` stamped as sent)
   POSTed straight to the harness's sink with a plain httpx client, ``--concurrency`` in flight,
   with a destination's headers (``webhook-id``, ``webhook-timestamp``, ``User-Agent``);
b) the relay: the events POSTed to `relay serve` (a fresh SQLite file) over
   ``--ingest-concurrency`` keep-alive connections; one HTTP destination (the sink, envelope
   format, ``ordering = --ordering``) and ONE `relay worker` (``worker_concurrency =
   --concurrency``) on ``redis://127.0.0.1:6379/<--redis-db>`` (flushed before and after).

Events: the harness's mix of kinds (each its own platform id); with ``--keys N`` they share N
platform ids (event i has the i % N-th, in ``requestId``, ``messageId`` or ``callId``: SMS
reports, Conversations statuses, call events, whose status or event name gets the event's place
in its key's line as a suffix, so that each stays a new event). With ``--ordering per-key`` the
relay runs three times on the same events, each on a fresh database and fresh processes:
``none``, ``per-key``, ``none``.

Figures: deliveries/s, (a) answered POSTs / (last arrival - first POST), (b) events that reached
the sink / (last first arrival - first POST to the receivers); ratio = (b) / the mean of both
(a) runs; ordering_ratio (per-key only) = per-key (b) / the mean of the ``none`` runs'; lag p50 /
p99 (b: first arrival - ``received_at``; a: send -> arrival); out_of_order: events whose first
arrival came before that of an event of their key received earlier (must be 0 with per-key);
lost: acknowledged, never at the sink within ``--drain-timeout`` (must be 0); duplicates; the
ingest rate; CPU of each process during (b); the deliveries' statuses (`relay deliveries list`).

``--destination amqp|nats|mqtt``: the machine's RabbitMQ, NATS JetStream or Mosquitto, read by
the broker's own consumer (``broker_bench.BrokerSink``); the baseline is the broker's own client
publishing the same messages with the destination's confirmation mode (no lag figure).
``--profile DIR`` runs serve and worker under cProfile (hot spots only: it slows them down).

Exit status 1 when events were lost or not acknowledged or a per-key run was out of order, 2
when the run failed (a process did not start, ``--timeout``)::

    python scripts/bench_relay.py [--json] [--events 5000] [--concurrency 50]
        [--destination http|amqp|nats|mqtt] [--ordering none|per-key] [--keys N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import secrets
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import harness
import httpx
from broker_bench import BROKERS, BrokerSink
from harness import HOST, Event, Stack, at_least, percentile

KEYED = {"/sms/dlr": ("requestId", "status"), "/conversations": ("messageId", "event"),
         "/tts/events": ("callId", "status")}  # fmt: skip


def keyed_events(count: int, seed: int, keys: int) -> tuple[list[Event], list[str | None]]:
    """``count`` callbacks sharing ``keys`` platform ids, and each one's key."""
    rng = random.Random(f"{seed}/keys")
    names = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(min(keys, count))]
    events, order = [], []
    for number, event in enumerate(harness.build_events(count, seed, paths=list(KEYED))):
        payload, (key_field, name_field) = json.loads(event.body), KEYED[event.path]
        key = names[number % keys]
        if isinstance(payload.get("href"), str):  # an SMS report's link names its requestId
            payload["href"] = payload["href"].replace(payload[key_field], key)
        payload[key_field], payload[name_field] = key, f"{payload[name_field]}-{number // keys}"
        events.append(Event(event.path, json.dumps(payload).encode()))
        order.append(key)
    return events, order


def envelope(number: int, event: Event) -> bytes:
    stamp = harness.iso_now()
    head = f'{{"id":"baseline-{number}","kind":"{harness.KINDS[event.path]}","source":"default",'
    return f'{head}"received_at":"{stamp}","payload":'.encode() + event.body + b"}"


def baseline(sink: Any, events: Sequence[Event], concurrency: int, deadline: float) -> dict:
    """(a): the events' envelopes straight to the sink, or to the broker by its own client."""

    async def http() -> dict[str, Any]:
        harness.sink_call(sink, "/_sink/reset", "POST")
        todo, ok = iter(range(len(events))), 0
        # Pools of at most 8 connections, as a worker's HTTP destinations shard theirs: one
        # httpx pool of 50 spends more CPU finding a free connection than sending.
        shards = [httpx.AsyncClient(limits=httpx.Limits(max_connections=8), trust_env=False)
                  for _ in range(math.ceil(concurrency / 8))]  # fmt: skip
        async with contextlib.AsyncExitStack() as stack:
            for shard in shards:
                await stack.enter_async_context(shard)

            async def sender(client: httpx.AsyncClient) -> None:
                nonlocal ok
                for number in todo:
                    headers = {"webhook-id": f"baseline-{number}", "user-agent": "callback-relay",
                               "webhook-timestamp": str(int(time.time())),
                               "content-type": "application/json"}  # fmt: skip
                    body = envelope(number, events[number])
                    answer = await client.post(f"http://{HOST}:{sink}/relay", content=body,
                                               headers=headers)  # fmt: skip
                    ok += answer.status_code // 100 == 2

            cpu, started = time.process_time(), time.time()
            await asyncio.gather(*(sender(shards[n % len(shards)]) for n in range(concurrency)))
            cpu_s = time.process_time() - cpu
            cpu = cpu_s / (time.time() - started)
        records = harness.sink_call(sink, "/_sink/records")
        lags = [lag * 1000 for _, _, lag in records]
        last = max((at + lag for _, at, lag in records), default=started)
        return {"ok": ok, "started": started, "last": last, "lags": lags, "cpu": cpu,
                "cpu_s": cpu_s}  # fmt: skip

    async def broker() -> dict[str, Any]:
        now = str(int(time.time()))
        messages = [(f"baseline-{n}", envelope(n, e), {"webhook-id": f"baseline-{n}",
                     "webhook-timestamp": now, "content-type": "application/json",
                     "kind": harness.KINDS[e.path], "source": "default"})
                    for n, e in enumerate(events)]  # fmt: skip
        run = await sink.publish(messages, concurrency, deadline)
        last = max((at for _, at in run.received), default=run.started)
        return {"ok": run.confirmed, "started": run.started, "last": last, "lags": [],
                "cpu": run.client_cpu, "cpu_s": run.client_cpu_s}  # fmt: skip

    with asyncio.Runner(loop_factory=harness.loop_factory()) as runner:
        figures = runner.run(broker() if isinstance(sink, BrokerSink) else http())
    elapsed = figures["last"] - figures["started"]
    figures["dps"] = figures["ok"] / elapsed if elapsed > 0 else 0.0
    return figures


def relay_run(
    args: argparse.Namespace,
    stack: Stack,
    sink: Any,
    events: Sequence[Event],
    keys: Sequence[str | None],
    ordering: str,
    tag: str,
    deadline: float,
) -> dict:
    """(b): fresh serve and worker; the events in; until all reached the sink."""
    workdir, token = stack.workdir / f"run{tag}", secrets.token_urlsafe(24)
    workdir.mkdir()
    if isinstance(sink, BrokerSink):
        sink.database = workdir / "relay.db"  # where the consumer's records find received_at
        table: Any = sink.table()
    else:
        url = f"http://{HOST}:{sink}/relay"
        table = ("destinations.sink", {"type": "http", "url": url, "format": "envelope",
                                       "ordering": ordering})  # fmt: skip
    config = harness.write_settings(workdir / "relay.toml", {
        "database_url": f"sqlite:///{workdir / 'relay.db'}", "redis_url": args.redis_url,
        "worker_concurrency": args.concurrency, "sweep_interval": args.sweep_interval,
    }, ("sources.default", {"token": token}), table)  # fmt: skip

    def wrap(name: str) -> tuple[str, ...]:
        return (
            ("cProfile", "-o", str(args.profile.resolve() / f"{name}.prof")) if args.profile else ()
        )

    serve, port = stack.start_serve(config, f"serve{tag}", wrap=wrap(f"serve{tag}"))
    worker, _ = stack.start_worker(config, f"worker{tag}", wrap=wrap(f"worker{tag}"))
    with asyncio.Runner(loop_factory=harness.loop_factory()) as runner:
        if isinstance(sink, BrokerSink):
            runner.run(sink.reset(len(events)))
        else:
            harness.sink_call(sink, "/_sink/reset", "POST")
        pids = {"serve": harness.process_tree(serve.pid), "worker": [worker.pid]}
        sink_pid = sink.pid if isinstance(sink, BrokerSink) else stack.procs[0].pid  # the first
        pids["sink"] = [sink_pid]
        cpu = {role: sum(harness.cpu_seconds(p).values()) for role, p in pids.items()}
        bench_cpu, started = time.process_time(), time.time()
        requests = [harness.hook_post(event, port, token) for event in events]
        due = [time.monotonic()] * len(requests)
        make, connections = requests.__getitem__, args.ingest_concurrency
        load = runner.run(harness.open_loop(port, make, due, connections, patience=args.timeout))
    acked_at = time.time()
    ids = [json.loads(body)["id"] if status == 200 else None
           for status, body in zip(load.status, load.answers, strict=True)]  # fmt: skip
    acked = {event_id for event_id in ids if event_id}
    limit = min(time.monotonic() + args.drain_timeout, deadline - 10)
    while time.monotonic() < limit and worker.process.poll() is None:
        if isinstance(sink, BrokerSink):
            if sink.done():
                break
        elif harness.sink_call(sink, "/_sink/count")["distinct"] >= len(acked):
            break
        time.sleep(0.05)
    ended = time.time()
    cpu = {role: (sum(harness.cpu_seconds(p).values()) - cpu[role]) / (ended - started)
           for role, p in pids.items()}  # fmt: skip
    cpu["bench"] = (time.process_time() - bench_cpu) / (ended - started)
    if isinstance(sink, BrokerSink):
        rows = [(i, at, r and datetime.fromisoformat(r).timestamp()) for i, at, r in sink.records()]
    else:
        rows = [(i, received + lag, received) for i, received, lag in
                harness.sink_call(sink, "/_sink/records")]  # fmt: skip
    first: dict[str, tuple[float, float | None]] = {}
    for event_id, arrived, received in rows:
        first.setdefault(event_id, (arrived, received))
    harness.settle(config, min(time.monotonic() + 10, limit))  # the statuses in SQL final
    deliveries = harness.delivery_statuses(config)
    for proc in (worker, serve):
        harness.stop(proc, first=signal.SIGINT if args.profile else signal.SIGTERM)
    harness.flush_redis(args.redis_url)  # the next worker starts on an empty queue
    delivered = [event_id for event_id in acked if event_id in first]
    lags = [(first[i][0] - first[i][1]) * 1000 for i in delivered if first[i][1] is not None]
    times = [first[event_id][0] for event_id in delivered] or [started]
    lines: dict[str, list[tuple[float, float]]] = {}
    for event_id, key in zip(ids, keys, strict=True):
        if event_id in first and key is not None and first[event_id][1] is not None:
            lines.setdefault(key, []).append((first[event_id][1], event_id, first[event_id][0]))
    out_of_order = 0
    for line in lines.values():
        latest = -math.inf
        for _, _, arrived in sorted(line):
            out_of_order += arrived < latest
            latest = max(latest, arrived)
    span = max(times) - started
    return {
        "ordering": ordering, "dps": len(delivered) / span if span > 0 else 0.0,
        "lag_p50_ms": percentile(lags, 0.5), "lag_p99_ms": percentile(lags, 0.99),
        "lag_max_ms": max(lags, default=math.nan), "out_of_order": out_of_order,
        "lost": len(acked) - len(delivered), "events": len(events), "acked": len(acked),
        "delivered": len(delivered), "duplicates": len(rows) - len(first),
        "ingest_eps": len(acked) / (acked_at - started), "ingest_s": acked_at - started,
        "drain_after_last_ack_s": max(times) - acked_at,
        "relay_only_dps": (len(times) - 1) / (max(times) - min(times)) if len(times) > 1 else 0.0,
        "cpu": cpu, "deliveries": deliveries,
    }  # fmt: skip


class Report:
    def __init__(self, args: argparse.Namespace, before: dict, runs: list[dict], after: dict):
        self.args, self.before, self.after, self.runs = args, before, after, runs
        self.main = runs[1] if len(runs) > 1 else runs[0]
        self.none = [run for run in runs if run is not self.main]
        self.baseline_dps = (before["dps"] + after["dps"]) / 2
        self.ratio = self.main["dps"] / self.baseline_dps if self.baseline_dps else 0.0
        none = sum(run["dps"] for run in self.none) / len(self.none) if self.none else 0.0
        self.ordering_ratio = self.main["dps"] / none if none else None

    @property
    def problems(self) -> list[str]:
        return [f"{run['ordering']}: {what}" for run in self.runs for what, bad in (
            (f"{run['lost']} lost", run["lost"]),
            (f"{run['events'] - run['acked']} not acknowledged", run["acked"] < run["events"]),
            (f"{run['out_of_order']} out of order", run["ordering"] == "per-key"
             and run["out_of_order"]),
        ) if bad]  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        def tidy(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: tidy(v) for k, v in value.items()}
            if isinstance(value, float):
                return None if math.isnan(value) else round(value, 3)
            return value

        b = self.before
        return tidy(self.main | {
            "baseline_dps": self.baseline_dps, "baseline_dps_before": b["dps"],
            "baseline_dps_after": self.after["dps"], "ratio": self.ratio,
            "ordering_ratio": self.ordering_ratio, "keys": self.args.keys,
            "baseline_errors": self.args.events - b["ok"],
            "baseline_lag_p50_ms": percentile(b["lags"], 0.5),
            "baseline_lag_p99_ms": percentile(b["lags"], 0.99), "baseline_client_cpu": b["cpu"],
            "destination": self.args.destination, "concurrency": self.args.concurrency,
            "ingest_concurrency": self.args.ingest_concurrency, "runs": self.runs,
            "problems": self.problems,
        })  # fmt: skip

    def as_text(self) -> str:
        a, b, m = self.args, self.before, self.main
        keys = "each its own key" if a.keys is None else f"{a.keys} keys"
        label = (
            "httpx -> sink" if a.destination == "http" else f"{a.destination} client -> consumer"
        )
        lines = [
            f"relay benchmark ({a.destination}): {m['events']} events ({keys}), worker_concurrency "
            f"{a.concurrency}, {a.ingest_concurrency} ingest connections",
            f"a) {label}: {self.baseline_dps:.1f} deliveries/s (mean of {b['dps']:.0f} before and "
            f"{self.after['dps']:.0f} after), lag p50 {percentile(b['lags'], 0.5):.1f} ms, p99 "
            f"{percentile(b['lags'], 0.99):.1f} ms (send -> arrival), client cpu {b['cpu']:.0%}",
            *(f"b) ordering {r['ordering']}: {r['dps']:.1f} deliveries/s, lag p50 "
              f"{r['lag_p50_ms']:.1f} ms, p99 {r['lag_p99_ms']:.1f} ms, max {r['lag_max_ms']:.0f} "
              f"(received_at -> arrival); out_of_order {r['out_of_order']}; lost {r['lost']}; "
              f"duplicates {r['duplicates']}; ingest {r['ingest_eps']:.0f}/s; relay-only "
              f"{r['relay_only_dps']:.0f}/s; cpu " + ", ".join(
                  f"{k} {v:.0%}" for k, v in r["cpu"].items()) + "; deliveries "
              + ", ".join(f"{k} {v}" for k, v in sorted(r["deliveries"].items()))
              for r in self.runs),
            f"ratio b/a: {self.ratio:.3f}",
        ]  # fmt: skip
        if self.ordering_ratio is not None:
            lines.append(f"ordering_ratio per-key/none: {self.ordering_ratio:.3f}")
        lines.append(
            "result: " + ("FAILED: " + "; ".join(self.problems) if self.problems else "ok")
        )
        return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> Report:
    deadline = time.monotonic() + args.timeout
    if args.keys is None:
        events, keys = harness.build_events(args.events, args.seed), [None] * args.events
    else:
        events, keys = keyed_events(args.events, args.seed, args.keys)
    orderings = ["none", "per-key", "none"] if args.ordering == "per-key" else [args.ordering]
    with Stack("bench-relay") as stack:
        harness.flush_redis(args.redis_url)
        stack.undo(lambda: harness.flush_redis(args.redis_url))
        if args.destination in BROKERS:
            sink: Any = BrokerSink(args.destination, stack.workdir, stack.workdir / "relay.db")
            stack.undo(lambda: asyncio.run(sink.close()))
        else:
            _, sink = stack.start_sink()
        before = baseline(sink, events, args.concurrency, deadline)
        runs = [relay_run(args, stack, sink, events, keys, ordering,
                          f"-{n}-{ordering}" if len(orderings) > 1 else "", deadline)
                for n, ordering in enumerate(orderings, 1)]  # fmt: skip
        after = baseline(sink, events, args.concurrency, deadline)
    return Report(args, before, runs, after)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--events", type=at_least(1), default=5000, help="events per target")
    add(
        "--concurrency",
        type=at_least(1),
        default=50,
        help="worker_concurrency of the worker, and the baseline's requests in flight",
    )
    add("--ingest-concurrency", type=at_least(1), help="connections to the receivers "
        "(default: --concurrency)")  # fmt: skip
    add("--timeout", type=float, default=900.0, help="overall limit, seconds")
    add(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="seconds after the last ack for every event to reach the sink",
    )
    add("--redis-db", type=int, default=12, help="Redis database on 127.0.0.1:6379 (flushed!)")
    add("--sweep-interval", default="5s", help="the relay's sweep_interval")
    add("--seed", type=int, default=20260101, help="payload generator seed")
    add(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run serve and worker under cProfile, "
        "writing DIR/serve.prof and DIR/worker.prof (per-key: DIR/serve-1-none.prof...)",
    )
    add("--destination", choices=("http", *BROKERS), default="http",
        help="http: the sink; amqp, nats, mqtt: the machine's broker (default: http)")  # fmt: skip
    add("--ordering", choices=("none", "per-key"), default="none", help="the destination's "
        "ordering; per-key also runs none before and after it (ordering_ratio)")  # fmt: skip
    add("--keys", type=at_least(1), metavar="N", help="the events share N platform ids")
    add("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.ingest_concurrency = args.ingest_concurrency or args.concurrency
    args.redis_url = f"redis://{HOST}:6379/{args.redis_db}"
    if args.ordering != "none" and args.destination != "http":
        parser.error("--ordering per-key is for --destination http only")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main("bench_relay", lambda: run_bench(args), args.json)


if __name__ == "__main__":
    sys.exit(main())
