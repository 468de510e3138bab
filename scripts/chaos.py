"""Fault-injection run: the scaled deployment under faults, then the sink reconciled with the store.

What runs (on 127.0.0.1, through the `relay` command line only): a fresh PostgreSQL database
``chaos_<random>`` (``--pg-admin-dsn``; `relay db upgrade`; dropped at the end), ``--servers``
`relay serve` and ``--workers`` `relay worker` processes (2 and 2) on one Redis database
(``--redis-url``, flushed at the start and the end), and the harness's recording sink as the one
HTTP destination: envelope format, ``timeout = "1s"``, the policy ``chaos`` (retries after 1 s
and 2 s, then every 2 s, gives up after 10 min), ``lease_margin = "2s"``, ``sweep_interval =
"1s"``. The platform is `relay simulate`: every scenario, the same number of instances each,
each scenario played by one process against one serve process (spread so that each gets about
as many callbacks), with the platform's retries on a clock ``--time-scale`` times real time;
about ``--events`` callbacks in all, at most ``--events / --ingest-seconds`` per second.

Faults, in this order, once the given share of ``--events`` is stored (each printed with its
time since the traffic started): 10 % the sink answers 500 for ``--fault-seconds``; 25 %
worker-1 SIGKILLed, started again ``--restart-delay`` s later; 40 % serve-2 restarted (SIGTERM,
same port); 55 % Redis flushed (``--flush db``: FLUSHDB; ``all``: FLUSHALL, only on a Redis of
the run's own) or, with ``--redis-outage sigterm|sigkill``, the run's own ``redis-server``
(append-only) stopped for ``--fault-seconds`` and started again on its port; 70 % the sink
answers only after ``--slow-seconds`` (longer than the 1 s timeout) for ``--fault-seconds``;
85 % worker-2 SIGKILLed and started again. ``--no-faults`` injects none and, unless
``--ingest-seconds`` / ``--time-scale`` are given, sends as fast as ``--concurrency`` allows.

At the end it waits (bounded by ``--timeout``) until every event is routed and every delivery
succeeded or dead, and reconciles the sink's log with the store. No command lists every event
with its platform id, order key and attempts in one read, so that, the wait and the progress
above read the documented tables ``received_events``, ``routed_events``, ``deliveries`` and
``delivery_attempts`` in SQL. Printed: accepted (rows, against the callbacks the platform sent
and had answered 2xx), delivered (distinct ids answered 2xx in time), lost (accepted, never
delivered, not dead: must be 0), duplicates (2xx beyond the first per id, explained: after a
time-out, across a worker kill, the flush, an outage; or unexplained), dead, lag p50/p99/max,
out_of_order (per order key, ``deliveries.order_key`` else the platform id, in the receivers'
order ``received_at`` then id: events whose first in-time 2xx came before that of an earlier
event of the key; dead and lost ones left out; with ``--ordering per-key`` it must be 0),
late_repeats (2xx copies of an event after a later event of its key: informative),
ordered_keys, events/s end to end and ingest/s, and the cores each role kept busy (``platform``:
the `relay simulate` processes and any relay process stopped on the way; ``rest``: PostgreSQL,
Redis, the rest of the machine).

``--destination amqp|nats|mqtt``: a broker instead of the HTTP sink (``broker_bench``): a private
server (NATS, Mosquitto) or a vhost of the run's own (RabbitMQ); the sink's two faults become
two broker outages, its consumer's arrivals are reconciled like the sink's.

Exit status 1 when anything was lost or a check failed, 2 when the run failed (a process did
not start or exited on its own, ``--timeout``); everything is cleaned up on every path::

    python scripts/chaos.py [--events 20000] [--json] [--flush db|all] [--ordering per-key]
    python scripts/chaos.py --no-faults --servers 1 --workers 1 --events 5000
    python scripts/chaos.py --destination nats --events 5000
    python scripts/chaos.py --redis-outage sigkill --events 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import asyncpg
import harness
import redis
from broker_bench import BROKERS, BrokerOutage
from harness import HOST, BenchError, Proc, Stack, at_least, percentile

FAULT_SHARES = (0.10, 0.25, 0.40, 0.55, 0.70, 0.85)
DESTINATION_TIMEOUT_S = 1.0
SLACK_S = 5.0  # a broker's consumer may see a message seconds after an outage or a kill
REPORT_MARGIN_S = 20.0  # kept from --timeout for the reconciliation and the clean-up
# Callbacks per instance of each scenario (the mean over its branches): to share --events out.
SCENARIO_LENGTH = {"sms-dlr": 2.9, "sms-dlr-legacy": 1.9, "conversations-status": 3.1,
                   "tts-call": 3.8}  # fmt: skip
LOG_PATTERNS = {
    "tracebacks": r"^Traceback", "lease expired during attempt": r"lease of delivery .* expired",
    "dead deliveries": r"delivery .* is dead", "sweep failed": r"sweep failed",
    "errors": r"\bERROR\b|\bError\b", "queue lost": r"queue lost: ",
    "queue back": r"queue back after ", "redis exceptions in tracebacks": r"^redis\.exceptions\.",
}  # fmt: skip


@dataclass
class Run:
    """The deployment, the faults noted so far and the platform's processes."""

    args: argparse.Namespace
    stack: Stack
    config: Path = Path()
    dsn: str = ""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    current: dict[str, Proc] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    sink: Any = None  # the sink's port, or a BrokerOutage

    def note(self, name: str, detail: str = "") -> None:
        t, at = time.monotonic() - self.t0, time.time()
        self.faults.append({"t_s": round(t, 2), "at": iso(at), "fault": name, "detail": detail})
        harness.log(f"t={t:7.2f}s  {name}{': ' + detail if detail else ''}")

    def start(self, role: str) -> Proc:
        count = sum(proc.name.startswith(f"{role}.") for proc in self.stack.procs)
        name = f"{role}.{count + 1}"
        if role.startswith("serve"):
            proc, self.ports[role] = self.stack.start_serve(self.config, name, self.ports[role])
        else:
            proc, _ = self.stack.start_worker(self.config, name)
        self.current[role] = proc
        return proc

    def check_alive(self) -> None:
        for role, proc in self.current.items():
            if proc.process.poll() is not None:
                raise BenchError(f"{role} exited:\n{proc.tail()}")

    def cpu(self) -> dict[str, float]:
        live = {p.name: harness.process_cpu_seconds(p.pid) for p in self.stack.procs}
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        live["platform"] = children.ru_utime + children.ru_stime  # reaped children
        return live | {"driver": time.process_time(), "machine": harness.machine_cpu()[0]}


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


# --- the deployment and the platform ----------------------------------------------------------


def deploy(run: Run) -> None:
    args, stack = run.args, run.stack
    redis_url = args.redis_url
    if args.redis_outage != "none":
        redis_proc, port = stack.start_redis(appendonly=True)
        run.current["redis"], run.ports["redis"] = redis_proc, port
        redis_url = f"redis://{HOST}:{port}/0"
    harness.flush_redis(redis_url)
    stack.undo(lambda: harness.flush_redis(redis_url))
    run.dsn = stack.postgres_database(args.pg_admin_dsn, "chaos")
    destination = {"timeout": f"{DESTINATION_TIMEOUT_S:g}s", "policy": "chaos"}
    if args.destination in BROKERS:
        run.sink = BrokerOutage(args.destination, stack.workdir, harness.free_port())
        stack.undo(lambda: asyncio.run(run.sink.aclose()))
        table: Any = run.sink.table("destinations.sink", **destination)
    else:
        _, run.sink = stack.start_sink()
        url = f"http://{HOST}:{run.sink}/relay"
        table = ("destinations.sink", {"type": "http", "url": url, "format": "envelope"})
        table[1].update(destination, **({"ordering": "per-key"} if args.ordering != "none" else {}))
    policy = {"type": "delays", "delays": ["1s", "2s"], "then": "2s", "give_up_after": "10m"}
    run.config = harness.write_settings(
        stack.workdir / "relay.toml",
        {"database_url": run.dsn, "redis_url": redis_url, "sweep_interval": "1s",
         "lease_margin": "2s", "worker_concurrency": args.worker_concurrency},
        ("sources.default", {"token": run.token}), table,
        ("policies.chaos", policy),
    )  # fmt: skip
    harness.relay(run.config, "db", "upgrade")
    for number in range(1, args.servers + 1):
        run.ports[f"serve-{number}"] = harness.free_port()
        run.start(f"serve-{number}")
    for number in range(1, args.workers + 1):
        run.start(f"worker-{number}")


def platform(run: Run) -> list[tuple[Proc, Path]]:
    """`relay simulate` processes: every scenario, as many instances each, spread over the
    serve processes so that each gets about as many callbacks."""
    args = run.args
    names = [line.split()[0] for line in harness.relay(None, "simulate", "list").splitlines()]
    lengths = {name: SCENARIO_LENGTH.get(name, 1.0) for name in names}
    instances = max(1, round(args.events / sum(lengths.values())))
    serves = sorted(role for role in run.ports if role.startswith("serve"))
    load = dict.fromkeys(serves, 0.0)
    rate = args.events / args.ingest_seconds if args.ingest_seconds > 0 else None
    concurrency = max(1, round(args.concurrency * len(serves) / len(names)))
    players = []
    for number, name in enumerate(sorted(names, key=lengths.__getitem__, reverse=True)):
        serve = min(serves, key=load.__getitem__)
        load[serve] += lengths[name]
        url = f"http://{HOST}:{run.ports[serve]}/hooks?token={run.token}"
        argv = [*harness.relay_command(), "simulate", name, "--url", url, "--count",
                str(instances), "--concurrency", str(concurrency), "--time-scale",
                str(args.time_scale), "--seed", str(args.seed + number), "--json"]  # fmt: skip
        if rate:
            argv += ["--rate", f"{rate * lengths[name] / sum(lengths.values()):.3f}"]
        out = run.stack.workdir / f"simulate-{name}.json"
        players.append((run.stack.start(f"simulate-{name}", argv, harness.relay_env(), out), out))
    return players


async def stored(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM received_events"))


async def inject_faults(run: Run, conn: asyncpg.Connection, done: asyncio.Event) -> None:
    """Each fault once its share of --events is stored (or the traffic is over)."""
    args = run.args

    async def sink_fault(mode: str, delay: float, what: str) -> None:
        if isinstance(run.sink, BrokerOutage):
            run.note(f"broker down: {run.sink.what}", await asyncio.to_thread(run.sink.down))
        else:
            harness.sink_call(run.sink, "/_sink/mode", "POST", {"mode": mode, "delay": delay})
            run.note(f"sink {what}", f"for {args.fault_seconds:g} s")
        await asyncio.sleep(args.fault_seconds)
        if isinstance(run.sink, BrokerOutage):
            run.note(f"broker back: {run.sink.what}", await asyncio.to_thread(run.sink.up))
        else:
            harness.sink_call(run.sink, "/_sink/mode", "POST", {"mode": "ok"})
            run.note("sink recovers", "answers 200 at once again")

    async def kill_worker(role: str) -> None:
        proc = run.current[role]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.process.wait()
        run.note(f"SIGKILL {role}", f"pid {proc.pid}")
        await asyncio.sleep(args.restart_delay)
        began = time.monotonic()
        proc = await asyncio.to_thread(run.start, role)
        run.note(f"{role} started again", f"pid {proc.pid}, in {time.monotonic() - began:.1f} s")

    async def restart_serve(role: str) -> None:
        proc, began = run.current[role], time.monotonic()
        run.note(f"SIGTERM {role}", f"pid {proc.pid}, port {run.ports[role]}")
        status = await asyncio.to_thread(harness.stop, proc)
        proc = await asyncio.to_thread(run.start, role)
        down = time.monotonic() - began
        run.note(f"{role} started again", f"pid {proc.pid}; exit {status}, down {down:.1f} s")

    async def flush() -> None:
        client = redis.Redis.from_url(args.redis_url)
        try:
            keys = client.dbsize()
            client.flushall() if args.flush == "all" else client.flushdb()
        finally:
            client.close()
        run.note(f"Redis {'FLUSHALL' if args.flush == 'all' else 'FLUSHDB'}", f"{keys} keys")

    async def redis_outage() -> None:
        how, port = signal.Signals[args.redis_outage.upper()], run.ports["redis"]
        await asyncio.to_thread(harness.stop, run.current.pop("redis"), 15.0, how)
        run.note(f"Redis down ({how.name})", f"port {port}; for {args.fault_seconds:g} s")
        await asyncio.sleep(args.fault_seconds)
        run.current["redis"], _ = await asyncio.to_thread(run.stack.start_redis, port, True)
        run.note("Redis back", f"started again on port {port}, same data")

    steps = [
        lambda: sink_fault("fail", 0.0, "answers HTTP 500"),
        lambda: kill_worker("worker-1"),
        lambda: restart_serve("serve-2"),
        flush if args.redis_outage == "none" else redis_outage,
        lambda: sink_fault("slow", args.slow_seconds, f"answers after {args.slow_seconds:g} s"),
        lambda: kill_worker("worker-2"),
    ]
    for share, step in zip(FAULT_SHARES, steps, strict=True):
        while await stored(conn) < share * args.events and not done.is_set():
            await asyncio.sleep(0.05)
        run.check_alive()  # else a kill or restart would hide a process that died
        await step()


async def traffic(run: Run) -> dict[str, Any]:
    """The platform's processes and the faults; the summed summaries of the platform."""
    conn = await asyncpg.connect(run.dsn, timeout=10)
    done = asyncio.Event()
    try:
        if isinstance(run.sink, BrokerOutage):  # reads until idle for long enough
            await run.sink.start_consumer(10**9, max(20.0, 3 * run.args.fault_seconds + 10))
        run.t0 = time.monotonic()
        players = platform(run)
        run.note("traffic starts", f"{len(players)} simulate processes")
        faults = None if run.args.no_faults else asyncio.create_task(inject_faults(run, conn, done))
        while any(proc.process.poll() is None for proc, _ in players):
            if faults is not None and faults.done():
                faults.result()  # a failed fault ends the run
            await asyncio.sleep(0.1)
        done.set()
        if faults is not None:
            await faults
        run.check_alive()
        summaries = [json.loads(out.read_text() or "{}").get("summary") for _, out in players]
        if None in summaries:
            raise BenchError("a simulate process printed no summary:\n" + players[0][0].tail())
        total: Counter[str] = Counter()
        for summary in summaries:
            total.update({k: v for k, v in summary.items() if isinstance(v, int)})
            total.update({f"answer {k}": v for k, v in summary["answers"].items()})
        run.note("traffic done", f"{total['attempts']} requests, given up {total['given_up']}")
        return dict(total) | {"seconds": time.monotonic() - run.t0}
    finally:
        await conn.close()


# --- settling and the reconciliation ----------------------------------------------------------

OPEN_WORK = """SELECT
 (SELECT count(*) FROM received_events e WHERE NOT EXISTS
   (SELECT 1 FROM routed_events r WHERE r.event_id = e.id)),
 (SELECT count(*) FROM deliveries WHERE status NOT IN ('succeeded', 'dead')),
 (SELECT count(*) FROM received_events e WHERE NOT EXISTS
   (SELECT 1 FROM deliveries d WHERE d.event_id = e.id AND d.destination = 'sink'))"""
EVENTS = """SELECT e.id, e.received_at, e.kind, e.event_name, coalesce(d.order_key,
 e.platform_id) AS key, d.status, d.attempts FROM received_events e LEFT JOIN deliveries d
 ON d.event_id = e.id AND d.destination = 'sink' ORDER BY e.received_at, e.id"""
ATTEMPTS = """SELECT d.event_id, a.number, a.started_at, a.duration_ms, a.status_code, a.error
 FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id ORDER BY a.number"""


async def settle(run: Run, deadline: float) -> bool:
    """Until every event is routed and every delivery succeeded or dead (False at the deadline)."""
    conn = await asyncpg.connect(run.dsn, timeout=10)
    try:
        while any(await conn.fetchrow(OPEN_WORK)):
            if time.monotonic() >= deadline:
                return False
            run.check_alive()
            await asyncio.sleep(0.5)
        return True
    finally:
        await conn.close()


def reconcile(run: Run, events: Sequence[Any], attempts: Sequence[Any], answers: Any) -> dict:
    """The store (``events`` in the receivers' order) against the sink's ``answers``."""
    at = {f["fault"]: [] for f in run.faults}
    for fault in run.faults:
        at[fault["fault"]].append(datetime.fromisoformat(fault["at"]).timestamp())
    kills = [t for name, ts in at.items() if name.startswith("SIGKILL") for t in ts]
    flushes = [t for name, ts in at.items() if name.startswith("Redis FLUSH") for t in ts]
    outages = [
        t for name, ts in at.items() if name.startswith(("Redis ", "broker back")) for t in ts
    ]
    slack = SLACK_S if isinstance(run.sink, BrokerOutage) else 0.0
    in_time: dict[str, float] = {}
    successes: dict[str, list[tuple[float, str]]] = {}
    requests: Counter[str] = Counter()
    for row in answers:
        event_id, arrived, status, mode = str(row[0]), float(row[1]), row[-2], row[-1]
        requests[f"{mode} {status}"] += 1
        if 200 <= status < 300:
            successes.setdefault(event_id, []).append((arrived, mode))
            if mode == "ok":
                in_time.setdefault(event_id, arrived)
    received = {row["id"]: row["received_at"].timestamp() for row in events}
    status = {row["id"]: row["status"] for row in events if row["status"]}
    dead = {event_id for event_id, s in status.items() if s == "dead"}
    delivered = set(received) & set(in_time)
    lost = set(received) - delivered - dead
    reasons: Counter[str] = Counter()
    unexplained = []
    for event_id, arrivals in successes.items():
        for (before, mode), (after, _) in pairwise(arrivals):

            def between(moments: list[float], slack: float = 0.0) -> bool:
                return any(before - slack <= t <= after for t in moments)  # noqa: B023

            reason = ("after a time-out" if mode == "slow"
                      else "across a worker kill" if between(kills, slack)
                      else "across the Redis flush" if between(flushes)
                      else "across an outage" if between(outages, slack)
                      else "unexplained")  # fmt: skip
            reasons[reason] += 1
            if reason == "unexplained" and len(unexplained) < 10:
                unexplained.append({"event_id": event_id, "arrivals": [a for a, _ in arrivals]})
    lags = [in_time[event_id] - received[event_id] for event_id in delivered]
    log: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        log.setdefault(a["event_id"], []).append(
            {"number": a["number"], "started_at": round(a["started_at"].timestamp(), 3),
             "ms": round(a["duration_ms"]), "status": a["status_code"], "error": a["error"]}
        )  # fmt: skip
    lines: dict[str, list[Any]] = {}
    for row in events:
        if row["key"]:
            lines.setdefault(row["key"], []).append(row)
    out_of_order = late = keys = keyed = 0
    samples: list[dict[str, Any]] = []
    for key, line in lines.items():
        if len(line) < 2:
            continue
        keys, keyed = keys + 1, keyed + len(line)
        compared = [r["id"] for r in line if r["id"] in in_time and r["id"] not in dead]
        latest, earliest_later = -math.inf, math.inf
        for event_id in compared:
            if in_time[event_id] >= latest:
                latest = in_time[event_id]
                continue
            out_of_order += 1
            if len(samples) < 10:
                samples.append({"order_key": key, "event_id": event_id, "line": [
                    {"event_id": r["id"], "what": f"{r['kind']} {r['event_name'] or '-'}",
                     "received_at": received[r["id"]], "first_in_time": in_time.get(r["id"]),
                     "arrivals_2xx": successes.get(r["id"], []), "status": r["status"],
                     "attempts": log.get(r["id"], [])} for r in line]})  # fmt: skip
        for event_id in reversed(compared):
            repeats = [a for a, _ in successes[event_id] if a != in_time[event_id]]
            late += sum(a > earliest_later for a in repeats)
            earliest_later = min(earliest_later, in_time[event_id])
    succeeded = {event_id for event_id, s in status.items() if s == "succeeded"}
    return {
        "accepted": len(received), "delivered": len(delivered), "lost": len(lost),
        "duplicates": sum(len(a) - 1 for a in successes.values()), "dead": len(dead),
        "max_lag_s": max(lags, default=math.nan), "lag_p50_s": percentile(lags, 0.5),
        "lag_p99_s": percentile(lags, 0.99), "out_of_order": out_of_order,
        "late_repeats": late, "ordered_keys": keys, "ordered_events": keyed,
        "duplicate_reasons": dict(reasons), "late_only": len(set(successes) - set(in_time)),
        "unknown_at_sink": len(set(successes) - set(received)),
        "succeeded_not_seen": len(succeeded - set(in_time)),
        "deliveries": dict(Counter(status.values())),
        "delivery_attempts": sum(row["attempts"] or 0 for row in events),
        "sink_requests": dict(requests), "last_delivery_at": max(
            (in_time[event_id] for event_id in delivered), default=math.nan),
        "lost_ids": sorted(lost)[:20], "unexplained_duplicates": unexplained,
        "out_of_order_samples": samples,
    }  # fmt: skip


def log_notes(procs: Sequence[Proc]) -> dict[str, Any]:
    """Counts of notable lines in the relay processes' logs, with a few samples."""
    counts: Counter[str] = Counter()
    samples: dict[str, list[str]] = {}
    for proc in procs:
        if proc.name.startswith(("serve", "worker")):
            for line in proc.log_path.read_text(errors="replace").splitlines():
                for label in (k for k, p in LOG_PATTERNS.items() if re.search(p, line)):
                    counts[label] += 1
                    if len(kept := samples.setdefault(label, [])) < 3:
                        kept.append(f"{proc.name}: {line.strip()[:300]}")
    return {"counts": dict(counts), "samples": samples}


# --- the whole run ------------------------------------------------------------------------------


@dataclass
class Report:
    args: argparse.Namespace
    figures: dict[str, Any]

    @property
    def problems(self) -> list[str]:
        f, found = self.figures, []
        checks = [
            (f["lost"], f"{f['lost']} accepted events were never delivered"),
            (not f["settled"], "deliveries were still open at the deadline"),
            (f["given_up"], f"the platform gave up on {f['given_up']} callbacks"),
            (f["accepted"] != f["callbacks"],
             f"{f['accepted']} events stored for {f['callbacks']} callbacks sent"),
            (f["unknown_at_sink"], f"{f['unknown_at_sink']} ids at the sink are not stored"),
            (f["succeeded_not_seen"], f"{f['succeeded_not_seen']} succeeded, not at the sink"),
            (self.args.ordering == "per-key" and f["out_of_order"],
             f"{f['out_of_order']} events reached the sink before an earlier one of their key"),
        ]  # fmt: skip
        return found + [text for failed, text in checks if failed]

    def as_json(self) -> dict[str, Any]:
        figures = {k: v if not isinstance(v, float) else None if math.isnan(v) else round(v, 2)
                   for k, v in self.figures.items()}  # fmt: skip
        return figures | {"problems": self.problems}

    def as_text(self) -> str:
        f = self.figures

        def pairs(figures: dict[str, Any]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(figures.items())) or "none"

        must = "must be 0" if f["ordering"] == "per-key" else "informative"
        return "\n".join([
            f"chaos run: {f['callbacks']} callbacks to {f['servers']} serve processes, "
            f"{f['workers']} workers, ordering {f['ordering']}, {f['duration_s']:.1f} s in all "
            f"(traffic {f['traffic_s']:.1f} s)",
            *(f"  t={x['t_s']:7.2f}s  {x['fault']}: {x['detail']}" for x in f["faults"]),
            f"accepted {f['accepted']} (rows in received_events; callbacks sent {f['callbacks']})",
            f"delivered {f['delivered']} (distinct ids answered 2xx in time at the sink)",
            f"lost {f['lost']} (accepted, never delivered, not dead)",
            f"duplicates {f['duplicates']}: {pairs(f['duplicate_reasons'])}",
            f"dead {f['dead']}",
            f"lag p50 {f['lag_p50_s']:.2f} s, p99 {f['lag_p99_s']:.2f} s, "
            f"max {f['max_lag_s']:.1f} s",
            f"out_of_order {f['out_of_order']} ({must}), "
            f"late_repeats {f['late_repeats']}, ordered_keys {f['ordered_keys']} "
            f"({f['ordered_events']} events)",
            f"platform: {f['platform_attempts']} requests, answers {pairs(f['platform_answers'])}, "
            f"given up {f['given_up']}",
            f"deliveries in SQL: {pairs(f['deliveries'])}; sink: {pairs(f['sink_requests'])}",
            f"throughput: {f['events_per_s']:.1f} events/s end to end, ingest "
            f"{f['ingest_per_s']:.1f} events/s",
            f"cpu, cores busy from the traffic's start to settled: {pairs(f['cpu_cores'])}",
            f"process logs: {pairs(f['log_notes']['counts'])}",
            "result: " + ("FAILED: " + "; ".join(self.problems) if self.problems else "ok"),
        ])  # fmt: skip


def cpu_cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    cores: Counter[str] = Counter()
    for name, spent in after.items():
        if not math.isnan(used := spent - before.get(name, 0.0)):
            cores[name.split(".")[0].split("-")[0]] += used / seconds
    cores["rest"] = cores["machine"] - sum(v for k, v in cores.items() if k != "machine")
    return {name: round(value, 2) for name, value in cores.items()} | {"cores": os.cpu_count()}


def run_chaos(args: argparse.Namespace) -> Report:
    started = time.monotonic()
    deadline = started + args.timeout
    with Stack("chaos", args.keep_logs) as stack:
        run = Run(args, stack)
        deploy(run)

        async def play() -> dict[str, Any]:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic() - REPORT_MARGIN_S)):
                cpu_before = run.cpu()
                platform_figures = await traffic(run)
                settled = await settle(run, deadline - REPORT_MARGIN_S)
            cpu = cpu_cores(cpu_before, run.cpu(), time.monotonic() - run.t0)
            run.note("settled" if settled else "deadline: deliveries still open")
            conn = await asyncpg.connect(run.dsn, timeout=10)
            try:
                events, attempts = await conn.fetch(EVENTS), await conn.fetch(ATTEMPTS)
            finally:
                await conn.close()
            if isinstance(run.sink, BrokerOutage):
                answers = await run.sink.answers(deadline - REPORT_MARGIN_S / 2)
            else:
                answers = harness.sink_call(run.sink, "/_sink/answers")
            return {"settled": settled, "cpu_cores": cpu, "platform": platform_figures,
                    **reconcile(run, events, attempts, answers)}  # fmt: skip

        try:
            figures = asyncio.run(play())
        except TimeoutError:
            raise BenchError("the run took longer than --timeout") from None
        figures["log_notes"] = log_notes(stack.procs)
    p = figures.pop("platform")
    window = figures.pop("last_delivery_at") - (time.time() - (time.monotonic() - run.t0))
    figures |= {
        "destination": args.destination, "ordering": args.ordering, "callbacks": p["events"],
        "given_up": p["given_up"], "platform_attempts": p["attempts"],
        "platform_answers": {k[7:]: v for k, v in p.items() if k.startswith("answer ")},
        "faults": [f for f in run.faults if f["fault"] not in ("traffic done", "settled")],
        "duration_s": time.monotonic() - started, "traffic_s": p["seconds"],
        "events_per_s": figures["accepted"] / window if window > 0 else math.nan,
        "ingest_per_s": figures["accepted"] / p["seconds"], "servers": args.servers,
        "workers": args.workers, "faults_injected": not args.no_faults,
        "time_scale": args.time_scale, "ingest_seconds": args.ingest_seconds,
    }  # fmt: skip
    return Report(args, figures)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--events", type=at_least(1), default=20_000, help="callbacks to send (about)")
    add("--timeout", type=float, default=900.0, help="overall limit, seconds")
    add("--json", action="store_true", help="print one JSON object")
    add("--seed", type=int, default=20260301, help="the platform's seed")
    add("--ingest-seconds", type=float, help="spread the callbacks over at least this long "
        "(0: as fast as possible); default 40, or 0 with --no-faults")  # fmt: skip
    add("--no-faults", action="store_true", help="inject no fault: a throughput run")
    add("--servers", type=at_least(1), default=2, help="relay serve processes (default 2)")
    add("--workers", type=at_least(1), default=2, help="relay worker processes (default 2)")
    add("--concurrency", type=at_least(1), default=25, help="callbacks in flight per serve")
    add("--worker-concurrency", type=at_least(1), default=50, help="per relay worker")
    add("--time-scale", type=float, help="the platform's clock against real time (its retry "
        "delays shrink with it); default 0.1, or 0.001 with --no-faults")  # fmt: skip
    add("--fault-seconds", type=float, default=5.0, help="how long each sink fault lasts")
    add("--slow-seconds", type=float, default=2.0, help="the sink's delay while timing out")
    add("--restart-delay", type=float, default=1.0, help="seconds from a kill to the restart")
    add("--flush", choices=["all", "db"], default="db", help="db: FLUSHDB of the run's "
        "database (default); all: FLUSHALL (only on a Redis of the run's own)")  # fmt: skip
    add("--redis-outage", choices=("none", "sigterm", "sigkill"), default="none",
        help="instead of the flush, stop a redis-server of the run's own with this signal for "
        "--fault-seconds and start it again on its port (--redis-url is not used)")  # fmt: skip
    add("--redis-url", default=os.environ.get("RELAY_CHAOS_REDIS_URL", "redis://127.0.0.1:6379/11"))
    pg = os.environ.get("RELAY_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    add("--pg-admin-dsn", default=pg, help="where to CREATE the run's database")
    add("--keep-logs", type=Path, metavar="DIR", help="copy the process logs here")
    add("--destination", choices=("http", *BROKERS), default="http", help="http: the sink; "
        "amqp, nats, mqtt: a broker of the run's own, taken down twice")  # fmt: skip
    add("--ordering", choices=("none", "per-key"), default="none",
        help="per-key: an event sent before an earlier one of its key fails the run")  # fmt: skip
    args = parser.parse_args(argv)
    if args.time_scale is None:
        args.time_scale = 0.001 if args.no_faults else 0.1
    if args.ingest_seconds is None:
        args.ingest_seconds = 0.0 if args.no_faults else 40.0
    if not args.no_faults and (args.servers < 2 or args.workers < 2):
        parser.error("the faults need --servers and --workers of at least 2 (or --no-faults)")
    if args.ordering != "none" and args.destination != "http":
        parser.error("--ordering per-key is checked against the HTTP sink (--destination http)")
    if args.time_scale <= 0 or args.slow_seconds <= DESTINATION_TIMEOUT_S:
        parser.error("--time-scale must be positive, --slow-seconds above 1 s")
    harness.require_local(args.redis_url, "Redis")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return harness.run_main("chaos", lambda: run_chaos(args), args.json)


if __name__ == "__main__":
    sys.exit(main())
