"""Broker destinations are destinations like any other: a broker that is down makes a failed
attempt under the policy, counted in the metrics, listed by the CLI and shown by the console
with its type and target, and never with the password of its URL."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.cli import main
from relay.dispatch.in_process import InProcessDispatcher
from relay.observe.metrics import WorkerMetrics
from relay.outbox.tables import PENDING
from relay.server import services as services_module
from relay.server.services import router_for, worker_services
from relay.settings import Settings
from relay.simulator import factories
from relay.store import inspect
from tests.conftest import TOKEN
from tests.console_support import console_client
from tests.relay_support import Clock, store_events
from tests.support import free_port

PASSWORD = "pw-s3cret-of-the-broker"


def broker_table(broker: str, port: int) -> dict[str, Any]:
    """A destination of ``broker`` type at a port nothing listens on."""
    common = {"timeout": "2s"}
    match broker:
        case "amqp":
            url = f"amqp://relay:{PASSWORD}@127.0.0.1:{port}/vhost"
            return {"type": "amqp", "url": url, "exchange": "events", **common}
        case "nats":
            url = f"nats://relay:{PASSWORD}@127.0.0.1:{port}"
            return {"type": "nats", "url": url, "subject": "cb.{kind}", **common}
        case _:
            url = f"mqtt://relay:{PASSWORD}@127.0.0.1:{port}"
            return {"type": "mqtt", "url": url, "topic": "cb/{kind}", **common}


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("broker", ["amqp", "nats", "mqtt"])
async def test_a_broker_that_is_down_is_a_failed_attempt_seen_everywhere(
    engine: AsyncEngine,
    database_url: str,
    tmp_path: Path,
    broker: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # the broker clients' own records too
    port = free_port()
    table = broker_table(broker, port) | {"policy": "later"}
    settings = Settings(
        database_url=database_url,
        sources={"default": {"token": TOKEN}},
        destinations={"bus": table},
        policies={"later": {"type": "delays", "delays": ["1m"], "give_up_after": "1h"}},
    )
    clock = Clock()
    await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr())], clock)
    metrics = WorkerMetrics()
    services = worker_services(
        settings, engine, InProcessDispatcher(concurrency=1), clock, metrics=metrics
    )
    try:
        await services.start()  # a broker that is down is no reason to refuse to start
        events = await outbox.unrouted_events(engine, clock() + timedelta(days=1), 10)
        due = await outbox.route_events(engine, router_for(settings), events, clock())
        started = asyncio.get_running_loop().time()
        await services.deliverer.attempt_many([item.id for item in due])
        took = asyncio.get_running_loop().time() - started
    finally:
        await services.aclose()

    assert took < 2.0  # refused at once: no wait for the destination's 2 s timeout
    [row] = await inspect.list_deliveries(engine)
    assert (row["status"], row["attempts"]) == (PENDING, 1)
    assert row["next_attempt_at"] is not None  # waits under the policy: 1 minute later
    shown = await inspect.get_delivery(engine, row["id"])
    assert shown is not None
    [attempt] = shown["attempt_log"]
    assert attempt["error"] == "connection refused", attempt
    assert PASSWORD not in json.dumps(shown)
    assert f"{broker}://127.0.0.1:{port}" in caplog.text  # start() said where, and why
    assert PASSWORD not in caplog.text
    assert "Traceback" not in caplog.text
    failures = metrics.registry.get_sample_value(
        "relay_delivery_attempts_total", {"destination": "bus", "outcome": "failed"}
    )
    assert failures == 1

    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "{database_url}"\n[sources.default]\ntoken = "{TOKEN}"\n'
        f"[destinations.bus]\n"
        + "".join(f"{key} = {json.dumps(value)}\n" for key, value in table.items())
        + '[policies.later]\ntype = "delays"\ndelays = ["1m"]\n'
    )
    listed = await asyncio.to_thread(cli, "destinations", "list", "--json", "--config", str(config))
    [bus] = json.loads(listed)
    assert bus["type"] == broker
    assert bus["target"].startswith(f"{broker}://127.0.0.1:")
    assert bus["consecutive_failures"] == 1
    text = await asyncio.to_thread(cli, "destinations", "list", "--config", str(config))
    assert broker in text
    assert PASSWORD not in listed + text


async def test_the_console_shows_each_destination_type_and_target(engine: AsyncEngine) -> None:
    settings = Settings(destinations={"bus": broker_table("amqp", 5672)})
    targets = {name: f"{d.type}: {d.target()}" for name, d in settings.destinations.items()}
    async with console_client(engine, Clock(), ["bus"], targets=targets) as console:
        await console.login()
        page = (await console.http.get("/console/destinations")).text
    assert "amqp: amqp://127.0.0.1:5672/vhost exchange &#39;events&#39; key {kind}.{source}" in page
    assert PASSWORD not in page


@pytest.mark.parametrize("broker", ["amqp", "nats", "mqtt"])
async def test_a_broker_that_never_answers_does_not_hold_the_start(
    engine: AsyncEngine,
    database_url: str,
    broker: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that accepts connections and never answers: the worker (or `relay serve`'s
    receivers) starts after START_WAIT_SECONDS, not after the destination's long timeout."""
    monkeypatch.setattr(services_module, "START_WAIT_SECONDS", 0.5)
    held: list[asyncio.StreamWriter] = []

    async def accept_and_say_nothing(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    silent = await asyncio.start_server(accept_and_say_nothing, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    table = broker_table(broker, port) | {"timeout": "60s"}
    settings = Settings(database_url=database_url, destinations={"bus": table, "bus2": table})
    services = worker_services(settings, engine, InProcessDispatcher(concurrency=1), Clock())
    try:
        started = asyncio.get_running_loop().time()
        await services.start()
        took = asyncio.get_running_loop().time() - started
    finally:
        await asyncio.wait_for(services.aclose(), 30)
        for writer in held:
            writer.close()
        silent.close()
    assert took < 3.0  # both destinations waited for together, then left to their deliveries
    assert "still connecting after 0.5 s at start" in caplog.text
