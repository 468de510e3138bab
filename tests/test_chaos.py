"""The fault-injection run (``scripts/chaos.py``), shortened: two serve processes and two workers
on PostgreSQL and Redis, a destination that fails and then times out, a worker SIGKILLed, a serve
process restarted and Redis flushed (FLUSHALL: the whole server) while the simulator sends; in the
end every accepted event has reached the destination; with ``ordering = "per-key"`` on the
destination, the events of each platform id in the order they arrived; with Redis SIGKILLed and
started again instead of flushed, the same, and no process exits. The Redis server is the
test's own (``redis-server`` on a free port, fixture ``private_redis_url``), never the machine's
shared one. The script and the relay processes it starts import this checkout (``PYTHONPATH``),
whichever copy of the package the interpreter has installed.

Needs PostgreSQL on 127.0.0.1 and the ``redis-server`` binary (missing: fails under CI=true,
skipped otherwise).
``RELAY_TEST_CHAOS_EVENTS`` changes the number of callbacks (default 2000);
``RELAY_TEST_CHAOS_FLUSH=db`` flushes only the run's Redis database instead of the whole server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis
from redis.exceptions import RedisError

from tests.conftest import PG_ADMIN_DSN, service_missing

ROOT = Path(__file__).resolve().parent.parent
CHAOS = ROOT / "scripts" / "chaos.py"
EVENTS = int(os.environ.get("RELAY_TEST_CHAOS_EVENTS", "2000"))
FLUSH = os.environ.get("RELAY_TEST_CHAOS_FLUSH", "all")
RUN_TIMEOUT_S = 170  # the script's own limit; it cleans up and exits when it is reached
KILL_AFTER_S = RUN_TIMEOUT_S + 60
PER_KEY_EVENTS = 600  # sent over 20 s, as in the broker test: the faults start at 2 s to 21 s
FAULTS = {
    "sink answers HTTP 500",
    "SIGKILL worker-1",
    "SIGTERM serve-2",
    "Redis FLUSHALL" if FLUSH == "all" else "Redis FLUSHDB",
    "sink answers after 2 s",
    "SIGKILL worker-2",
}


def require_services(redis_url: str) -> None:
    async def connect() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
        await conn.close()

    try:
        asyncio.run(connect())
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        service_missing("PostgreSQL", exc)
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2)
    try:
        client.ping()
    except (RedisError, OSError) as exc:
        service_missing("Redis", exc)
    finally:
        client.close()


def run_chaos(*args: str) -> tuple[int, str, str]:
    """The script as a subprocess; on overrun it gets SIGTERM (its clean-up runs), then KILL."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, str(CHAOS), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
    return process.returncode, stdout, stderr


def chaos_report(redis_url: str, *args: str) -> dict[str, Any]:
    """A run of the script with ``args`` on the test's Redis and PostgreSQL, ``--json``,
    ``--timeout`` and ``--flush`` as the module sets them; exit 0 required; its report."""
    status, stdout, stderr = run_chaos(
        *args,
        "--json",
        "--timeout",
        str(RUN_TIMEOUT_S),
        "--flush",
        FLUSH,
        "--redis-url",
        redis_url,
        "--pg-admin-dsn",
        PG_ADMIN_DSN,
    )
    assert status == 0, f"exit status {status}\n{stderr[-4000:]}\n{stdout[-4000:]}"
    report: dict[str, Any] = json.loads(stdout)
    print(json.dumps(report, indent=1))  # shown with -rP, or when an assertion fails
    return report


@pytest.mark.slow
def test_nothing_is_lost_under_faults(private_redis_url: str) -> None:
    require_services(private_redis_url)
    report = chaos_report(private_redis_url, "--events", str(EVENTS), "--ingest-seconds", "30")

    assert report["lost"] == 0, report["lost_ids"]
    assert report["settled"]
    assert report["given_up"] == 0  # the platform's retries got every callback accepted
    assert abs(report["callbacks"] - EVENTS) < EVENTS // 10  # whole scenario instances
    assert report["accepted"] == report["callbacks"]
    assert report["delivered"] == report["accepted"]
    assert report["dead"] == 0
    assert report["unknown_at_sink"] == 0
    assert report["succeeded_not_seen"] == 0
    assert report["deliveries"] == {"succeeded": report["accepted"]}
    assert {fault["fault"] for fault in report["faults"]} >= FAULTS
    # The time-out window makes the sink see events whose answers the relay never got.
    assert report["duplicates"] >= report["duplicate_reasons"].get("after a time-out", 0) > 0
    # Without ordering the events of one key go in parallel: the count is informative only.
    assert report["ordering"] == "none"
    assert isinstance(report["out_of_order"], int) and report["out_of_order"] >= 0
    assert isinstance(report["late_repeats"], int) and report["late_repeats"] >= 0
    assert report["ordered_keys"] > 0


@pytest.mark.slow
def test_per_key_order_holds_under_faults(private_redis_url: str) -> None:
    """The same faults with ``ordering = "per-key"`` on the sink's destination: every event
    arrives, and no event reaches the sink before an earlier one of its platform id (an SMS's
    reports, a call's events, a Conversations message's statuses)."""
    require_services(private_redis_url)
    events = PER_KEY_EVENTS
    report = chaos_report(
        private_redis_url,
        *("--ordering", "per-key", "--events", str(events)),
        *("--ingest-seconds", "20", "--fault-seconds", "2"),
    )

    assert report["ordering"] == "per-key"
    assert report["lost"] == 0, report["lost_ids"]
    assert report["settled"]
    assert report["accepted"] == report["delivered"] == report["callbacks"]
    assert report["deliveries"] == {"succeeded": report["accepted"]}
    assert report["out_of_order"] == 0, report["out_of_order_samples"]
    # The seed's scenario instances: about half the keys have 2 to 4 events (150 at 600).
    assert report["ordered_keys"] >= report["callbacks"] // 5
    assert {fault["fault"] for fault in report["faults"]} >= FAULTS
    # The sink's faults met deliveries in flight: retries held their keys' later events back.
    assert report["sink_requests"].get("fail 500", 0) > 0
    assert report["duplicate_reasons"].get("after a time-out", 0) > 0


@pytest.mark.slow
def test_nothing_is_lost_when_the_broker_goes_away(private_redis_url: str) -> None:
    """The same plan against a private JetStream server, stopped and started again twice: the
    stream drops every retried publish, so each event is read exactly once."""
    require_services(private_redis_url)
    events = 600
    report = chaos_report(
        private_redis_url,
        *("--destination", "nats", "--events", str(events)),
        *("--ingest-seconds", "20", "--fault-seconds", "2"),
    )

    assert report["destination"] == "nats"
    assert report["lost"] == 0, report["lost_ids"]
    assert report["accepted"] == report["delivered"] == report["callbacks"]
    assert report["deliveries"] == {"succeeded": report["accepted"]}
    assert report["duplicates"] == 0  # Nats-Msg-Id: the stream dropped every retried publish
    outages = [f["fault"] for f in report["faults"] if f["fault"].startswith("broker")]
    assert outages == ["broker down: nats broker", "broker back: nats broker"] * 2


@pytest.mark.slow
def test_nothing_is_lost_when_redis_restarts(private_redis_url: str) -> None:
    """The same plan with Redis SIGKILLed and started again on the same port instead of the
    flush (a redis-server of the script's own): no process exits (the run would fail), every
    event arrives, and every process that lost the queue said so once and said it was back."""
    require_services(private_redis_url)
    events = 600
    report = chaos_report(
        private_redis_url,
        *("--redis-outage", "sigkill", "--events", str(events)),
        *("--ingest-seconds", "20", "--fault-seconds", "2"),
    )

    assert report["lost"] == 0, report["lost_ids"]
    assert report["settled"]
    assert report["accepted"] == report["delivered"] == report["callbacks"]
    assert report["deliveries"] == {"succeeded": report["accepted"]}
    faults = [fault["fault"] for fault in report["faults"]]
    assert "Redis down (SIGKILL)" in faults and "Redis back" in faults
    assert not [fault for fault in faults if fault.startswith("Redis FLUSH")]
    counts = report["log_notes"]["counts"]
    assert counts.get("queue lost", 0) >= 2  # at least both workers, which poll all along
    assert counts.get("queue back", 0) >= 2  # theirs (serve logs at warning level here)
    assert counts.get("redis exceptions in tracebacks", 0) == 0, report["log_notes"]["samples"]
