"""README's broker examples work as printed: each configuration, run by a real relay worker, and
each consumer snippet, run against the machine's broker, carry a posted event from the
receivers to the consumer (names made unique per run, nothing else changed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tomllib
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import aiomqtt
import nats
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.server.runtime import start
from tests.conftest import REDIS_URL, service_missing
from tests.test_relay_e2e import eventually, post_events, quick_settings, serving, worker_on

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
SECTION = README[README.index("### To your message broker") :]
BLOCKS = re.findall(r"```(toml|python)\n(.*?)```", SECTION, re.S)
EXAMPLES = dict(
    zip(
        ("amqp", "nats", "mqtt"),
        ((BLOCKS[i][1], BLOCKS[i + 1][1]) for i in range(0, 6, 2)),
        strict=True,
    )
)
NAMES = {"amqp": "platform-events", "nats": "callbacks", "mqtt": "callbacks"}


class Received(Exception):
    """Stops a consumer snippet once the expected event has come."""


def unique(text: str, broker: str, run: str) -> str:
    """The example with its queue, exchange, subject or topic prefix made unique to the run."""
    return text.replace(NAMES[broker], f"{NAMES[broker]}-{run}")


async def prepare(broker: str, run: str) -> Callable[[], Awaitable[None]]:
    """What the README says must exist beforehand (a NATS stream); returns the clean-up."""
    try:
        if broker == "nats":
            nc = await nats.connect("nats://127.0.0.1:4222", connect_timeout=2)
            js = nc.jetstream()
            name = f"README_{run}".replace("-", "_")
            await js.add_stream(name=name, subjects=[f"callbacks-{run}.>"])

            async def drop_stream() -> None:
                await js.delete_stream(name)
                await nc.close()

            return drop_stream
        if broker == "amqp":
            connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:5672/", timeout=2)

            async def drop_queue_and_exchange() -> None:
                channel = await connection.channel()
                await channel.queue_delete(f"platform-events-{run}")
                await channel.exchange_delete(f"platform-events-{run}")
                await connection.close()

            return drop_queue_and_exchange
        async with aiomqtt.Client("127.0.0.1", 1883, timeout=2):
            pass
    except (OSError, TimeoutError, aio_pika.exceptions.AMQPError, nats.errors.Error) as error:
        service_missing(broker, error)
    except aiomqtt.MqttError as error:
        service_missing(broker, error)
    return _nothing


async def _nothing() -> None:
    return None


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["amqp", "nats", "mqtt"])
async def test_the_readme_example_carries_an_event_to_its_consumer(
    engine: AsyncEngine, database_url: str, broker: str
) -> None:
    run = uuid.uuid4().hex[:10]
    toml_text, python_text = (unique(text, broker, run) for text in EXAMPLES[broker])
    destinations = tomllib.loads(toml_text)["destinations"]
    cleanup = await prepare(broker, run)
    namespace: dict[str, Any] = {
        "aio_pika": aio_pika,
        "aiomqtt": aiomqtt,
        "nats": nats,
        "json": json,
        "contextlib": contextlib,
    }
    exec(compile(python_text, f"README.md ({broker} consumer)", "exec"), namespace)
    got: list[tuple[dict[str, Any], Any]] = []

    async def handle(envelope: dict[str, Any], headers: Any) -> None:
        got.append((envelope, headers))
        raise Received

    settings = quick_settings(database_url, destinations, redis_url=REDIS_URL)
    consumer = asyncio.create_task(namespace["consume"](handle))
    try:
        await asyncio.sleep(0.5)  # MQTT keeps nothing for a subscriber that is not there yet
        runtime = await start(settings)
        async with serving(runtime) as client, worker_on(settings, engine):
            [event_id] = await post_events(client, 1)
            await eventually(lambda: consumer.done(), timeout=30)
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await cleanup()
    with contextlib.suppress(Received):
        consumer.result()
    [(envelope, headers)] = got
    assert envelope["id"] == event_id
    assert headers["webhook-id"] == event_id
    assert headers["kind"] == envelope["kind"]
