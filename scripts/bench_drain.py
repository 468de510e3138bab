"""Drain bench: the worker's CPU per delivery, per destination type, beside the bare client's CPU
per message for the same messages.

For each ``--types`` entry, on a fresh PostgreSQL database (`relay db upgrade`) and Redis
database ``--redis-db`` (flushed before and after), with one destination of that type:

1. `relay serve` (scaled: ``redis_url`` set, no worker running) stores ``--events`` callbacks,
   until `relay deliveries list` shows one pending delivery per event; then it is stopped;
2. `relay worker` alone drains that backlog, until its ``/metrics`` count as many succeeded
   attempts; its CPU (``/proc``, sampled every 0.1 s) between the first arrival at the
   destination and the last, divided by the deliveries in between, is its CPU per delivery
   (its start-up and first connections left out; the total over every delivery is printed
   too, as ``gross``);
3. the bare client sends the same count of envelopes to the same place, before and after the
   drain (the mean of both): httpx POSTs to the harness's sink (pools of 8), aio-pika publishes
   with confirms, nats-py JetStream publishes, aiomqtt (paho-mqtt) QoS 1 publishes, redis-py
   XADDs; its CPU (this process's) per message.

``--mode embedded``: the store is a SQLite file instead, and after step 1 `relay serve` alone,
on the same file without ``redis_url``, drains the backlog (its sweeper finds it at start); its
CPU is that of serve and its writer process together.

Figures per type: worker CPU ms per delivery (and gross), the client's CPU ms per message,
their ratio, deliveries/s from the first arrival to the last (the sink's, the consumer's, or the
stream's entry ids: Redis's clock), the deliveries' statuses and the distinct messages that
arrived.

Only the command line, the settings file, HTTP and the documented metrics are used, so the same
file measures any tree: ``PYTHONPATH=<tree> python3 scripts/bench_drain.py``. Exit status 1 when
a delivery did not succeed or a message did not arrive, 2 when the run failed::

    python scripts/bench_drain.py [--json] [--events 5000] [--concurrency 50]
        [--types http,amqp,nats,mqtt,redis-stream] [--mode scaled|embedded]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

import harness
import redis
from bench_relay import baseline, envelope
from broker_bench import BROKERS, BrokerSink
from harness import HOST, BenchError, Stack, at_least

TYPES = ("http", *BROKERS, "redis-stream")
POLL_S = 0.1


def stream_arrivals(url: str, stream: str) -> list[tuple[str, float]]:
    """(id field, time added) of each entry: an entry id's first part is Redis's clock in ms."""
    client = redis.Redis.from_url(url)
    try:
        entries = client.xrange(stream)
    finally:
        client.close()
    return [(f[b"id"].decode(), int(i.split(b"-")[0]) / 1000) for i, f in entries]


def stream_baseline(url: str, stream: str, events: Sequence[harness.Event], concurrency: int):
    """The bare client: redis-py XADDs the envelopes as the destination does; CPU seconds."""

    async def run() -> float:
        client = redis.asyncio.Redis.from_url(url)
        todo = iter(enumerate(events))

        async def sender() -> None:
            for number, event in todo:
                fields = {"id": f"baseline-{number}", "kind": harness.KINDS[event.path],
                          "source": "default", "received_at": harness.iso_now(),
                          "body": envelope(number, event),
                          "content_type": "application/json"}  # fmt: skip
                await client.xadd(stream, fields, maxlen=100_000, approximate=True)

        try:
            await client.delete(stream)
            cpu = time.process_time()
            await asyncio.gather(*(sender() for _ in range(concurrency)))
            return time.process_time() - cpu
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=harness.loop_factory()) as runner:
        return runner.run(run())


def client_cpu(kind: str, sink: Any, events: Sequence[harness.Event], args: argparse.Namespace,
               stream: str) -> float:  # fmt: skip
    """The bare client's CPU seconds for every event once."""
    if kind == "redis-stream":
        return stream_baseline(args.redis_url, stream, events, args.concurrency)
    deadline = time.monotonic() + args.drain_timeout
    return baseline(sink, events, args.concurrency, deadline)["cpu_s"]


def succeeded(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    return harness.metric(text, "relay_delivery_attempts_total", outcome="succeeded")


def drain(args: argparse.Namespace, stack: Stack, kind: str, events: Sequence[harness.Event]):
    """One type: the backlog stored, drained by one worker; its figures."""
    workdir, token = stack.workdir / kind, secrets.token_urlsafe(24)
    workdir.mkdir()
    stream, sink = f"bench-drain-{secrets.token_hex(4)}", None
    if kind in BROKERS:
        sink = BrokerSink(kind, workdir, workdir / "unused.db")
        stack.undo(lambda: asyncio.run(sink.close()))
        table: Any = sink.table()
    elif kind == "http":
        _, sink = stack.start_sink()
        table = ("destinations.sink", {"type": "http", "url": f"http://{HOST}:{sink}/relay",
                                       "format": "envelope"})  # fmt: skip
    else:
        table = ("destinations.sink", {"type": "redis-stream", "url": args.redis_url,
                                       "stream": stream})  # fmt: skip
    harness.flush_redis(args.redis_url)
    before = client_cpu(kind, sink, events, args, stream)
    if args.mode == "scaled":
        database = stack.postgres_database(args.postgres, "drain")
    else:
        database = f"sqlite:///{workdir / 'relay.db'}"
    top = {"database_url": database, "worker_concurrency": args.concurrency}
    tables = (("sources.default", {"token": token}), table)
    config = harness.write_settings(workdir / "relay.toml", top | {"redis_url": args.redis_url},
                                    *tables)  # fmt: skip
    harness.relay(config, "db", "upgrade")

    serve, port = stack.start_serve(config, f"serve-{kind}")
    requests = [harness.hook_post(event, port, token) for event in events]
    with asyncio.Runner(loop_factory=harness.loop_factory()) as runner:
        load = runner.run(harness.open_loop(port, requests.__getitem__,
                                            [time.monotonic()] * len(requests), 50))  # fmt: skip
    acked = sum(status == 200 for status in load.status)
    limit = time.monotonic() + 120
    while len(harness.relay_json(config, "deliveries", "list", "--status", "pending",
                                 "--limit", "100000")) < acked:  # fmt: skip
        if time.monotonic() > limit:
            raise BenchError(f"{kind}: the backlog was not routed within 120 s")
        time.sleep(0.5)
    harness.stop(serve)
    queued = harness.flush_redis(args.redis_url, only_count=True)

    if isinstance(sink, BrokerSink):
        asyncio.run(sink.reset(acked))
    elif kind == "http":
        harness.sink_call(sink, "/_sink/reset", "POST")
    else:  # the baseline's entries away, the relay's queue kept
        with redis.Redis.from_url(args.redis_url) as client:
            client.delete(stream)
    metrics = harness.free_port()
    if args.mode == "scaled":
        argv = [*harness.relay_command(), "worker", "--config", str(config), "--metrics-port",
                str(metrics), "--log-level", "warning"]  # fmt: skip
    else:  # the same store without redis_url: serve's own sweeper finds the backlog
        embedded = harness.write_settings(workdir / "embedded.toml", top, *tables)
        argv = [*harness.relay_command(), "serve", "--config", str(embedded), "--host", HOST,
                "--port", str(metrics), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    started = time.time()
    worker = stack.start(f"worker-{kind}", argv, harness.relay_env())
    samples = [(started, 0.0)]  # (time, CPU seconds of the worker, or of serve and its writer)

    def cpu() -> float:
        return sum(harness.cpu_seconds(harness.process_tree(worker.pid)).values())

    limit = time.monotonic() + args.drain_timeout
    while succeeded(metrics) < acked:
        if worker.process.poll() is not None or time.monotonic() > limit:
            raise BenchError(f"{kind}: the worker did not drain the backlog:\n{worker.tail()}")
        samples.append((time.time(), cpu()))
        time.sleep(POLL_S)
    samples.append((time.time(), cpu()))
    harness.settle(config, time.monotonic() + 30)
    statuses = harness.delivery_statuses(config)
    harness.stop(worker)

    if isinstance(sink, BrokerSink):
        asyncio.run(sink.wait(time.monotonic() + 60))
        arrivals = sink.received()
    elif kind == "http":
        arrivals = [(i, at + lag) for i, at, lag in harness.sink_call(sink, "/_sink/records")]
    else:
        arrivals = stream_arrivals(args.redis_url, stream)
    after = client_cpu(kind, sink, events, args, stream)
    harness.flush_redis(args.redis_url)
    times = sorted(t for _, t in arrivals)
    if len(times) < 2:
        raise BenchError(f"{kind}: {len(times)} messages arrived")
    first, last = harness.interpolate(samples, times[0]), harness.interpolate(samples, times[-1])
    per_delivery = (last - first) / (len(times) - 1)
    per_message = (before + after) / 2 / len(events)
    distinct = {event_id for event_id, _ in arrivals}
    return {
        "type": kind, "events": len(events), "acked": acked, "queued_keys": queued,
        "worker_cpu_s": samples[-1][1], "cpu_before_first_arrival_s": first,
        "drain_s": samples[-1][0] - started,
        "worker_cpu_ms_per_delivery": per_delivery * 1000,
        "worker_cpu_ms_per_delivery_gross": samples[-1][1] / acked * 1000,
        "client_cpu_ms_per_message": per_message * 1000,
        "client_cpu_ms_before_after": [before / len(events) * 1000, after / len(events) * 1000],
        "ratio": per_delivery / per_message,
        "deliveries_per_s": (len(times) - 1) / (times[-1] - times[0]),
        "arrived": len(distinct), "duplicates": len(arrivals) - len(distinct),
        "statuses": statuses,
    }  # fmt: skip


class Report:
    def __init__(self, args: argparse.Namespace, runs: list[dict]) -> None:
        self.args, self.runs = args, runs

    @property
    def problems(self) -> list[str]:
        return [f"{r['type']}: {what}" for r in self.runs for what, bad in (
            (f"{r['events'] - r['acked']} not acknowledged", r["acked"] < r["events"]),
            (f"statuses {r['statuses']}", r["statuses"] != {"succeeded": r["acked"]}),
            (f"{r['acked'] - r['arrived']} did not arrive", r["arrived"] < r["acked"]),
        ) if bad]  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        def tidy(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: tidy(v) for k, v in value.items()}
            if isinstance(value, list):
                return [tidy(v) for v in value]
            if isinstance(value, float):
                return None if math.isnan(value) else round(value, 4)
            return value

        return tidy({"runs": self.runs, "concurrency": self.args.concurrency,
                     "mode": self.args.mode, "problems": self.problems})  # fmt: skip

    def as_text(self) -> str:
        lines = [f"drain bench ({self.args.mode}): {self.args.events} events, one worker "
                 f"(worker_concurrency "
                 f"{self.args.concurrency}), CPU ms per delivery (first to last arrival) / bare "
                 "client's per message"]  # fmt: skip
        for r in self.runs:
            lines.append(
                f"{r['type']:>12}: worker {r['worker_cpu_ms_per_delivery']:.3f} ms "
                f"(gross {r['worker_cpu_ms_per_delivery_gross']:.3f}, before the first arrival "
                f"{r['cpu_before_first_arrival_s']:.2f} s), client "
                f"{r['client_cpu_ms_per_message']:.3f} ms, "
                f"ratio {r['ratio']:.2f}; {r['deliveries_per_s']:.0f} deliveries/s; drained in "
                f"{r['drain_s']:.1f} s; arrived {r['arrived']}, duplicates {r['duplicates']}; "
                + ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
            )
        lines.append("result: " + ("FAILED: " + "; ".join(self.problems) if self.problems
                                   else "ok"))  # fmt: skip
        return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> Report:
    events = harness.build_events(args.events, args.seed)
    with Stack("bench-drain") as stack:
        stack.undo(lambda: harness.flush_redis(args.redis_url))
        runs = []
        for kind in args.types:
            harness.log(f"{kind}: storing {args.events} events, then draining them")
            runs.append(drain(args, stack, kind, events))
    return Report(args, runs)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--events", type=at_least(2), default=5000, help="the backlog, per type")
    add("--types", default=",".join(TYPES), help=f"comma-separated, of {', '.join(TYPES)}")
    add("--concurrency", type=at_least(1), default=50,
        help="worker_concurrency, and the bare client's messages in flight")  # fmt: skip
    add("--drain-timeout", type=float, default=300.0, help="seconds for one drain")
    add("--mode", choices=("scaled", "embedded"), default="scaled",
        help="scaled: the store on PostgreSQL, `relay worker` drains; embedded: the store on "
        "SQLite, `relay serve` without redis_url drains (its CPU with its writer's)")  # fmt: skip
    add("--redis-db", type=int, default=12, help="Redis database on 127.0.0.1:6379 (flushed!)")
    add("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="PostgreSQL admin URL: a fresh database is made per type (and dropped)")  # fmt: skip
    add("--seed", type=int, default=20260101, help="payload generator seed")
    add("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    args.types = [t.strip() for t in args.types.split(",") if t.strip()]
    if unknown := set(args.types) - set(TYPES):
        parser.error(f"unknown types: {', '.join(sorted(unknown))}")
    args.redis_url = f"redis://{HOST}:6379/{args.redis_db}"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main("bench_drain", lambda: run_bench(args), args.json)


if __name__ == "__main__":
    sys.exit(main())
