"""End to end, open loop: the lag from a callback's acknowledgement (its envelope's
``received_at``) to its arrival at an HTTP destination, under a paced load.

For each mode, a fresh store and fresh processes: ``embedded`` is `relay serve` on a new SQLite
file without ``redis_url``; ``scaled`` is a fresh PostgreSQL database (`relay db upgrade`), a
private `redis-server`, one `relay serve` and one `relay worker`. One HTTP destination points at
a sink of its own process on 127.0.0.1 that records ``arrival - received_at`` per delivery.

At each ``--rates`` rate, after a ``--warmup`` at that rate (drained, then forgotten), unique SMS
delivery reports are POSTed to ``/hooks/sms/dlr`` for ``--seconds``, paced open loop over
``--connections`` keep-alive connections; then the sink is drained. Reported: acknowledged/s,
ack p50/p99 (from each request's due time), lag p50/p90/p99/max, delivered against acknowledged,
whether the lag grows (last third's p50 > 1.5 x first third's + 10 ms), CPU ms per event of each
process (/proc utime + stime; a server's writer process counts with it). A mode *keeps up* at a
rate when the lag does not grow, ``acked/s >= 0.95 x offered`` and nothing is lost; the highest
such rate is reported (``--find-capacity`` steps up by 25 % until it fails).

Baseline, same run: the same paced load POSTed straight to the sink, each body an envelope
whose ``received_at`` is stamped as it is sent: the machine's HTTP round trip, the floor of any
lag. Each mode's lag p50 is printed as a ratio over it.

The load generator is our own asyncio one (``harness.open_loop``), not Debian's ``wrk``: wrk is
closed loop (a connection's next request waits for its answer, and Lua ``delay()`` counts from
then, so a slow server slows the load and hides its own queue), wrk2's fixed-rate mode is not
packaged, and the baseline needs ``received_at`` stamped per request at microsecond precision,
which wrk's Lua cannot do. Here request ``i`` is due at ``start + i / rate`` whatever happened
before; when every connection is busy it waits for one, one more connection is opened (up to
``--max-connections``, as a platform facing a slow endpoint would), and its ack latency counts
from its due time (``waited`` says how often). It costs about 0.1-0.4 ms of CPU per request,
shown as ``bench``. ``others`` is the machine's CPU used by anything but these processes: the
noise of a shared machine, to read the figures with.

    PYTHONPATH=. python3 scripts/bench_e2e.py --rates 100,500 --seconds 20 [--json]

``--profile DIR`` also records each measured phase of serve and worker with ``py-spy`` (installed
apart: ``pip install py-spy``) as collapsed stacks, to find what bounds a rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness import HOST, Proc, Stack, log, percentile

MODES = ("embedded", "scaled")


@dataclass
class Target:
    """Where the load goes and which processes do the work."""

    name: str
    port: int
    path: str
    procs: dict[str, Proc]
    admin_url: str = ""  # scaled: to find the database's backends
    database: str = ""


def relay_config(
    stack: Stack, database_url: str, sink_port: int, redis_url: str = ""
) -> tuple[Path, str]:
    """A settings file with one source and the sink as the one destination; the hook's path."""
    token = secrets.token_urlsafe(24)
    config = stack.workdir / f"relay-{len(list(stack.workdir.glob('*.toml')))}.toml"
    config.write_text(
        f'database_url = "{database_url}"\n'
        + (f'redis_url = "{redis_url}"\n' if redis_url else "")
        + f'\n[sources.default]\ntoken = "{token}"\n'
        f'\n[destinations.sink]\ntype = "http"\nurl = "http://{HOST}:{sink_port}/deliveries"\n'
    )
    return config, f"/hooks/sms/dlr?token={token}"


def start_mode(stack: Stack, mode: str, sink_port: int, admin_url: str) -> Target:
    relay, env, port = harness.relay_command(), harness.relay_env(), harness.free_port()
    serve_argv = ["serve", "--host", HOST, "--port", str(port), "--log-level", "warning",
                  "--no-access-log"]  # fmt: skip
    if mode == "embedded":
        db = stack.workdir / f"embedded-{port}.db"
        config, path = relay_config(stack, f"sqlite:///{db}", sink_port)
        serve = stack.start("serve", [*relay, *serve_argv, "--config", str(config)], env)
        harness.wait_http(serve, port, "/readyz")
        return Target(mode, port, path, {"serve": serve})
    database_url = stack.postgres_database(admin_url)
    redis, redis_port = stack.start_redis()
    config, path = relay_config(stack, database_url, sink_port, f"redis://{HOST}:{redis_port}/0")
    subprocess.run([*relay, "db", "upgrade", "--config", str(config)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    serve = stack.start("serve", [*relay, *serve_argv, "--config", str(config)], env)
    harness.wait_http(serve, port, "/readyz")
    worker = stack.start("worker", [*relay, "worker", "--config", str(config)], env)
    procs = {"serve": serve, "worker": worker, "redis": redis}
    return Target(mode, port, path, procs, admin_url, database_url.rsplit("/", 1)[1])


def pids(target: Target, sink: Proc) -> dict[str, list[int]]:
    """Each role's processes now (a PostgreSQL database's backends as ``postgres``)."""
    roles = {name: harness.process_tree(proc.pid) for name, proc in target.procs.items()}
    roles["sink"] = [sink.pid]
    if target.database:
        query = f"SELECT pid FROM pg_stat_activity WHERE datname = '{target.database}'"
        out = subprocess.run(["psql", target.admin_url, "-Atc", query], capture_output=True,
                             text=True, check=False).stdout  # fmt: skip
        roles["postgres"] = [int(line) for line in out.split()]
    return roles


def drain(sink_port: int, expected: int, patience: float) -> int:
    """Wait until the sink holds ``expected`` records or ``patience`` s pass without progress."""
    count, last_change = -1, time.monotonic()
    while time.monotonic() - last_change < patience:
        now = harness.sink_call(sink_port, "/_sink/count")["requests"]
        if now >= expected:
            return int(now)
        if now != count:
            count, last_change = now, time.monotonic()
        time.sleep(0.1)
    return count


async def paced(
    target: Target, rate: float, seconds: float, connections: int, max_connections: int
) -> harness.Load:
    """Unique delivery reports at ``rate``/s for ``seconds`` (the baseline: as envelopes)."""
    bodies = [harness.dlr_body(i) for i in range(max(1, round(rate * seconds)))]
    if target.name == "baseline":  # stamped as sent, like the relay's received_at

        def make(i: int) -> bytes:
            stamp = harness.iso_now().encode()
            body = b'{"id":"%d","received_at":"%s","payload":%s}' % (i, stamp, bodies[i])
            return harness.post(target.path, target.port, body)

    else:
        make = [harness.post(target.path, target.port, body) for body in bodies].__getitem__
    due = harness.schedule(time.monotonic() + 0.2, rate, len(bodies))
    return await harness.open_loop(target.port, make, due, connections, max_connections)


def measure(
    target: Target, sink: Proc, sink_port: int, rate: float, args: argparse.Namespace
) -> dict:
    """One rate on one target: warm-up, drain, forget, then the measured phase and its drain."""
    baseline = target.name == "baseline"
    harness.sink_call(sink_port, "/_sink/reset", "POST")
    warm = asyncio.run(paced(target, rate, args.warmup, args.connections, args.max_connections))
    drain(sink_port, sum(s // 100 == 2 for s in warm.status), args.drain)
    harness.sink_call(sink_port, "/_sink/reset", "POST")
    roles = pids(target, sink)
    machine_before = harness.machine_cpu()
    before, bench_before = (
        {r: harness.cpu_seconds(p) for r, p in roles.items()},
        time.process_time(),
    )
    profilers = profile(target, rate, args) if args.profile and not baseline else []
    load = asyncio.run(paced(target, rate, args.seconds, args.connections, args.max_connections))
    for profiler in profilers:
        profiler.wait()
    ok = [i for i, s in enumerate(load.status) if s // 100 == 2]
    delivered = drain(sink_port, len(ok), args.drain)
    roles_after = pids(target, sink)
    after = {r: harness.cpu_seconds(set(roles[r]) | set(p)) for r, p in roles_after.items()}
    bench_cpu = time.process_time() - bench_before
    machine_after = harness.machine_cpu()
    records = harness.sink_call(sink_port, "/_sink/records")
    if baseline:
        acked_ids = {str(i) for i in ok}
    else:
        acked_ids = {json.loads(load.answers[i])["id"] for i in ok}
    delivered_ids = {row[0] for row in records}
    lags = [row[2] * 1000 for row in sorted(records, key=lambda row: row[1])]
    third = len(lags) // 3
    first, last = percentile(lags[:third], 0.5), percentile(lags[-third:] if third else [], 0.5)
    grows = bool(third) and last > 1.5 * first + 10
    span = max(args.seconds, max((load.acked[i] for i in ok), default=0) - load.due[0])
    cpu = {r: sum(t - before.get(r, {}).get(p, 0.0) for p, t in after[r].items()) for r in after}
    cpu["bench"] = bench_cpu
    busy, total = (end - start for start, end in zip(machine_before, machine_after, strict=True))
    others = max(0.0, busy - sum(cpu.values())) / total * 100  # the machine's other load
    events = max(1, len(ok))
    result = {
        "target": target.name, "offered": rate, "sent": len(load.due), "acked": len(ok),
        "acked_per_s": round(len(ok) / span, 1), "waited": load.waited,
        "connections": load.connections, "machine_busy_pct": round(busy / total * 100, 1),
        "others_busy_pct": round(others, 1),
        "ack_p50_ms": percentile(load.ack_ms(), 0.5), "ack_p99_ms": percentile(load.ack_ms(), 0.99),
        "lag_p50_ms": percentile(lags, 0.5), "lag_p90_ms": percentile(lags, 0.9),
        "lag_p99_ms": percentile(lags, 0.99), "lag_max_ms": max(lags, default=math.nan),
        "lag_first_third_p50_ms": first, "lag_last_third_p50_ms": last, "lag_grows": grows,
        "delivered": delivered, "lost": len(acked_ids - delivered_ids),
        "cpu_ms_per_event": {r: round(seconds * 1000 / events, 3) for r, seconds in cpu.items()},
    }  # fmt: skip
    result["keeps_up"] = not grows and result["lost"] == 0 and len(ok) / span >= 0.95 * rate
    log(line(result))
    return result


def profile(target: Target, rate: float, args: argparse.Namespace) -> list[subprocess.Popen]:
    """``py-spy record`` of serve (and worker) for the measured phase, as collapsed stacks in
    ``--profile``'s directory (its sampling costs CPU: read the figures of such a run apart)."""
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    seconds = str(max(1, round(args.seconds)))
    profilers = []
    for role, proc in target.procs.items():
        if role in ("serve", "worker"):
            output = str(out / f"{target.name}-{rate:.0f}-{role}.txt")
            argv = ["py-spy", "record", "--nonblocking", "--subprocesses", "--format", "raw",
                    "--duration", seconds, "--pid", str(proc.pid), "--output", output]  # fmt: skip
            profilers.append(
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
    return profilers


def line(r: dict[str, Any]) -> str:
    cpu = " ".join(f"{k}={v:.2f}" for k, v in r["cpu_ms_per_event"].items())
    ratio = f" x{r['lag_ratio']:.1f}" if "lag_ratio" in r else ""
    return (
        f"{r['target']:>8} {r['offered']:>6.0f}/s acked {r['acked_per_s']:>7.1f}/s "
        f"ack p50/p99 {r['ack_p50_ms']:.1f}/{r['ack_p99_ms']:.1f} ms | lag p50/p90/p99/max "
        f"{r['lag_p50_ms']:.1f}/{r['lag_p90_ms']:.1f}/{r['lag_p99_ms']:.1f}/"
        f"{r['lag_max_ms']:.0f} ms"
        f"{ratio} | {r['delivered']}/{r['acked']} delivered, lost {r['lost']}"
        f"{', GROWS' if r['lag_grows'] else ''} | cpu ms/event {cpu} | machine busy "
        f"{r['machine_busy_pct']:.0f} % (others {r['others_busy_pct']:.0f} %)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,500,1000", help="events/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per rate")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections")
    parser.add_argument("--max-connections", type=int, default=512, help="opened when all busy")
    parser.add_argument("--modes", default=",".join(MODES), help="embedded,scaled")
    parser.add_argument("--drain", type=float, default=30.0, help="s without progress: give up")
    parser.add_argument("--find-capacity", action="store_true", help="step up until it fails")
    parser.add_argument("--max-rate", type=float, default=4000.0, help="--find-capacity's cap")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--profile", metavar="DIR", help="py-spy profiles of each phase here")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    modes = [mode for mode in args.modes.split(",") if mode]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {sorted(unknown)}")
    results: list[dict[str, Any]] = []
    capacity: dict[str, float] = {}
    with Stack() as stack:
        sink, sink_port = stack.start_sink()
        log(f"sink on {sink_port}; baseline at {args.rates}/s")
        floor = {}
        for rate in rates:
            result = measure(
                Target("baseline", sink_port, "/baseline", {}), sink, sink_port, rate, args
            )
            floor[rate] = result["lag_p50_ms"]
            results.append(result)
        for mode in modes:
            log(f"starting {mode}")
            target = start_mode(stack, mode, sink_port, args.postgres)
            steps = list(rates)
            while steps:
                rate = steps.pop(0)
                result = measure(target, sink, sink_port, rate, args)
                if rate in floor:
                    result["lag_ratio"] = result["lag_p50_ms"] / floor[rate]
                results.append(result)
                if result["keeps_up"]:
                    capacity[mode] = max(capacity.get(mode, 0.0), rate)
                    step = round(rate * 1.25 / 50) * 50
                    if args.find_capacity and not steps and step <= args.max_rate:
                        steps.append(step)
            for proc in reversed(target.procs.values()):
                harness.stop(proc)
    if args.json:
        json.dump({"results": results, "keeps_up_to": capacity}, sys.stdout, indent=1)
        print()
    else:
        for result in results:
            print(line(result))
        print("keeps up to (events/s, of the rates run):", capacity)
    return 0


if __name__ == "__main__":
    sys.exit(main())
