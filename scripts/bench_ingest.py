"""Ingest benchmark: how fast `relay serve` acknowledges callbacks, next to a no-op baseline.

What is measured, in one run (both servers up, but only one of them under load at a time):

a) the baseline: ``scripts/noop_app.py`` (one catch-all POST route that reads the body and answers
   200 with a small JSON body) under uvicorn, one worker;
b) the real receiver: ``relay serve --no-access-log --log-level warning`` on a fresh SQLite
   database (WAL, synchronous=FULL) in a temp directory, one worker, every callback committed
   durably before its 200.

Both listen on 127.0.0.1 only, with the same uvicorn options: by default (``--baseline
guarded``) the no-op is served as `relay serve` serves the receivers
(``relay.server.serve.server_config``: httptools behind the connection guard with its default
limits, access log off, log level
warning, no proxy headers, no server header, uvloop), so the guard's cost is on both sides of the
ratio; ``--baseline uvicorn`` serves it with plain ``python -m uvicorn`` (loop and http ``auto``,
the same options otherwise), as releases before the guard did, which puts the guard's cost in
the ratio. Each gets the same realistic bodies
from ``relay.simulator.factories`` (a mix of sms.inbound, sms.dlr, numinfo.gnp,
conversations.status and tts.event; every body is a distinct event) at the same paths
(``/hooks/.../?token=...``). The load comes from this process: ``--concurrency`` keep-alive
HTTP/1.1 connections, one request in flight on each, request bytes serialized before the clock
starts, answers parsed as status line + Content-Length (uvloop when installed). ``--warmup``
requests per target are sent first and not counted.

The timed requests are split into ``--rounds`` turns, played baseline, receiver, receiver,
baseline, ... On a shared virtual machine the speed changes from one second to the next (the
baseline alone was seen anywhere between 9k and 19k requests/s, run to run); in turns, both
targets meet the same machine, which keeps the ratio steady. Each turn starts and ends with the
connections filling and draining, which costs both targets the same share of their time (about
concurrency / requests per turn, by Little's law), so the ratio is not biased by it; the
events/s of each read a few per cent lower than one long phase would give.

Printed per target: events/s (2xx answers per second of its timed turns) and p50/p99 latency
(send to complete answer, 2xx only); then ratio = receiver events/s / baseline events/s, and the
stored check: after the receiver has stopped, the ids in its ``received_events`` table must be
exactly the ids it acknowledged (warmup included). The exit status is 1 when that check fails,
2 when the run itself fails (a server did not start, ``--timeout`` expired).

Run it with the project's interpreter (needs the project installed)::

    python scripts/bench_ingest.py [--json] [--requests 20000] [--concurrency 64] [--rounds 20]

Shared with ``bench_relay.py``: the load generator and server helpers live in ``benchlib.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import secrets
import signal
import sqlite3
import sys
import tempfile
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from benchlib import (
    BenchError,
    Connection,
    Phase,
    Server,
    at_least,
    build_events,
    close_connections,
    drive,
    encode_requests,
    free_port,
    guarded_uvicorn_argv,
    loop_factory,
    open_connections,
    percentile_ms,
    relay_argv,
    relay_env,
    start_server,
    stop_server,
    uvicorn_argv,
    wait_ready,
)


def noop_argv(port: int, baseline: str) -> list[str]:
    if baseline == "uvicorn":
        return uvicorn_argv("noop_app:app", port)
    return guarded_uvicorn_argv("noop_app:app", port)


def write_config(workdir: Path, token: str) -> Path:
    config = workdir / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{workdir / "bench.db"}"\n\n'
        f'[sources.default]\ntoken = "{token}"\n',
        encoding="utf-8",
    )
    return config


# --- one target --------------------------------------------------------------------------------


@dataclass
class Target:
    """A started server, its connections, and its share of the load, split into rounds."""

    server: Server
    warmup: Sequence[bytes]
    rounds: list[Sequence[bytes]]
    read_ids: bool
    connections: list[Connection] = field(default_factory=list)
    warm: Phase | None = None
    timed: list[Phase] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.server.name


@dataclass
class TargetResult:
    """What one target did in its timed rounds (and which event ids it acknowledged overall)."""

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


def summarize(name: str, warmup: Phase, timed: Sequence[Phase], *, read_ids: bool) -> TargetResult:
    """One target's figures over all its timed rounds: the time is the sum of the rounds'."""
    statuses = [status for phase in timed for status in phase.statuses]
    latencies = sorted(
        latency
        for phase in timed
        for status, latency in zip(phase.statuses, phase.latencies_ns, strict=True)
        if 200 <= status < 300
    )
    elapsed = sum(phase.finished_at - phase.started_at for phase in timed)
    cpu = sum(phase.cpu_finished_at - phase.cpu_started_at for phase in timed)
    acked = sum(1 for status in statuses if 200 <= status < 300)
    result = TargetResult(
        name=name,
        requests=len(statuses),
        acked=acked,
        errors=len(statuses) - acked,
        elapsed_s=elapsed,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        client_cpu=cpu / elapsed if elapsed else 0.0,
    )
    if read_ids:
        for phase in (warmup, *timed):
            for status, body in zip(phase.statuses, phase.bodies, strict=True):
                if 200 <= status < 300:
                    _collect_id(result, body)
    return result


def _collect_id(result: TargetResult, body: bytes) -> None:
    try:
        result.acked_ids.append(str(json.loads(body)["id"]))
    except (ValueError, KeyError, TypeError):
        result.unreadable_answers += 1


def split_rounds(requests: Sequence[bytes], rounds: int) -> list[Sequence[bytes]]:
    """``requests`` in ``rounds`` consecutive slices of (nearly) equal size, none empty."""
    count = min(rounds, len(requests))
    bounds = [len(requests) * i // count for i in range(count + 1)]
    return [requests[start:end] for start, end in itertools.pairwise(bounds)]


async def drive_rounds(targets: Sequence[Target], concurrency: int) -> None:
    """Warm every target up, then drive their timed rounds in turns: round i of each target
    one after the other, the order reversed every other round (A B, B A, ...), so that a
    machine that speeds up or slows down during the run weighs on every target alike."""
    for target in targets:
        await wait_ready(target.server, "/healthz")
        target.connections = await open_connections(target.server.port, concurrency)
    for target in targets:
        target.warm = await drive(target.connections, target.warmup, keep_bodies=target.read_ids)
    for index, turns in enumerate(zip(*(target.rounds for target in targets), strict=True)):
        played = list(zip(targets, turns, strict=True))
        for target, requests in played if index % 2 == 0 else reversed(played):
            phase = await drive(target.connections, requests, keep_bodies=target.read_ids)
            target.timed.append(phase)


async def stop_targets(targets: Sequence[Target]) -> None:
    """Close the load's connections and stop every server (warn about unexpected exits)."""
    for target in targets:
        close_connections(target.connections)
    await asyncio.sleep(0.1)  # let the servers see the connections close
    for target in targets:
        status = await asyncio.to_thread(stop_server, target.server)
        if status not in (0, -signal.SIGTERM):  # uvicorn re-raises SIGTERM once shut down
            print(f"warning: {target.name} exited with status {status}", file=sys.stderr)


def result_of(target: Target) -> TargetResult:
    assert target.warm is not None
    return summarize(target.name, target.warm, target.timed, read_ids=target.read_ids)


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
    baseline_server: str = "guarded"

    @property
    def ratio(self) -> float:
        return self.receiver.eps / self.baseline.eps if self.baseline.eps else 0.0

    @property
    def problems(self) -> list[str]:
        return [] if self.stored_ok else ["stored events differ from those acknowledged"]

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
            "baseline_server": self.baseline_server,
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
        lines.append(f"ratio receiver/baseline ({self.baseline_server} baseline): {self.ratio:.3f}")
        lines.append(
            f"stored check: {self.stored} rows, {len(set(self.receiver.acked_ids))} distinct "
            f"acked events (warmup included): {verdict}"
        )
        return "\n".join(lines)


async def bench(args: argparse.Namespace, workdir: Path) -> Report:
    events = build_events(args.warmup + args.requests, args.seed)
    token = secrets.token_urlsafe(24)
    targets: list[Target] = []

    def add(name: str, argv: Sequence[str], port: int, env: dict[str, str], read_ids: bool) -> None:
        requests = encode_requests(events, port, token)
        server = start_server(name, argv, port, workdir, env)
        rounds = split_rounds(requests[args.warmup :], args.rounds)
        targets.append(Target(server, requests[: args.warmup], rounds, read_ids))

    try:
        port = free_port()
        add("baseline", noop_argv(port, args.baseline), port, relay_env(), read_ids=False)
        port = free_port()
        argv = relay_argv(port, write_config(workdir, token))
        add("receiver", argv, port, relay_env(), read_ids=True)
        await drive_rounds(targets, args.concurrency)
    finally:
        await stop_targets(targets)
    baseline, receiver = (result_of(target) for target in targets)

    ids = stored_ids(workdir / "bench.db")
    acked = receiver.acked_ids
    stored_ok = (
        receiver.unreadable_answers == 0
        and len(set(acked)) == len(acked)
        and set(ids) == set(acked)
        and len(ids) == len(acked)
    )
    return Report(baseline, receiver, len(ids), stored_ok, args.baseline)


async def bounded(coroutine: Coroutine[Any, Any, Report], seconds: float) -> Report:
    try:
        async with asyncio.timeout(seconds):
            return await coroutine
    except TimeoutError:
        raise BenchError(f"the run took longer than --timeout {seconds:g}s") from None


def run(args: argparse.Namespace, workdir: Path) -> Report:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(bounded(bench(args, workdir), args.timeout))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=at_least(1), default=20000, help="timed, per target")
    parser.add_argument("--concurrency", type=at_least(1), default=64, help="connections")
    parser.add_argument("--warmup", type=at_least(0), default=1000, help="untimed, per target")
    parser.add_argument(
        "--rounds", type=at_least(1), default=20, help="turns the timed requests are split into"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="overall limit, seconds")
    parser.add_argument("--seed", type=int, default=20260101, help="payload generator seed")
    parser.add_argument(
        "--baseline",
        choices=("guarded", "uvicorn"),
        default="guarded",
        help="serve the no-op as `relay serve` serves (default) or with plain uvicorn",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def run_in_tmp() -> Report:
        with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
            return run(args, Path(tmp))

    return harness.run_main("bench_ingest", run_in_tmp, args.json)


if __name__ == "__main__":
    sys.exit(main())
