"""The broker examples of docs/destinations.md work as printed: each consumer
snippet, run against the machine's broker, receives an event posted to the receivers and
published by a real relay worker under the configuration shown above it. Only the addresses
(pointed at the local brokers) and the names (made unique per run) are changed, and NATS's
fetch timeout is shortened so that the consumer lives through a hundred empty fetches first,
as a long-running one does (nats-py raises the builtin TimeoutError on some of them)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import tomllib
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiomqtt
import nats
import pytest
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.server.runtime import start
from tests.amqp_support import AMQP_BASE_URL
from tests.conftest import REDIS_URL, service_missing
from tests.mqtt_support import MQTT_URL
from tests.nats_support import NATS_URL
from tests.snippet_support import (
    Block,
    all_blocks,
    blocks_run_by,
    toml_above,
    with_placeholders_filled,
)
from tests.test_relay_e2e import eventually, post_events, quick_settings, serving, worker_on

BLOCKS = all_blocks()
CONSUMERS = blocks_run_by("consumer", BLOCKS)
LOCAL = {"amqp": AMQP_BASE_URL, "nats": NATS_URL, "mqtt": MQTT_URL}
EMPTY_FETCHES = 100
"""How many fetches find nothing before the event is posted (a long-running NATS consumer)."""
SHORT_FETCH = "timeout=0.05"


class Received(Exception):
    """Stops a consumer snippet once the expected event has come."""


def localised(text: str, broker: str, run: str) -> str:
    """The snippet pointed at the local broker, with its names made unique to the run."""
    local = LOCAL[broker]
    text = re.sub(rf"{broker}://[^\"\s]*", local, text)
    text = text.replace('"mosquitto.internal"', f'"{urlsplit(MQTT_URL).hostname}"')
    text = re.sub(r"\bplatform-events\b", f"platform-events-{run}", text)
    text = re.sub(r"\bcallbacks(?=[./])", f"callbacks-{run}", text)
    text = text.replace('"CALLBACKS"', f'"CALLBACKS_{run}"')
    return text.replace('"crm"', f'"crm-{run}"')


async def reachable(broker: str) -> None:
    """Skip (fail under CI) when the broker is not there."""
    try:
        if broker == "nats":
            nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
            await nc.close()
        elif broker == "amqp":
            connection = await aio_pika.connect(AMQP_BASE_URL, timeout=2)
            await connection.close()
        else:
            address = urlsplit(MQTT_URL)
            async with aiomqtt.Client(address.hostname or "", address.port or 1883, timeout=2):
                pass
    except (OSError, TimeoutError, aio_pika.exceptions.AMQPError, nats.errors.Error) as error:
        service_missing(broker, error)
    except aiomqtt.MqttError as error:
        service_missing(broker, error)


@contextlib.asynccontextmanager
async def cleaned_up(broker: str, run: str) -> AsyncIterator[None]:
    """Removes what the snippet and the relay made on the broker for this run."""
    try:
        yield
    finally:
        if broker == "nats":
            nc = await nats.connect(NATS_URL, connect_timeout=2)
            with contextlib.suppress(NotFoundError):
                await nc.jetstream().delete_stream(f"CALLBACKS_{run}")
            await nc.close()
        elif broker == "amqp":
            async with await aio_pika.connect(AMQP_BASE_URL, timeout=2) as connection:
                channel = await connection.channel()
                await channel.queue_delete(f"platform-events-{run}")
                await channel.exchange_delete(f"platform-events-{run}")


def counting_fetches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the fetches of every pull subscription (one entry per fetch that found nothing)."""
    empty: list[int] = []
    fetch = JetStreamContext.PullSubscription.fetch

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fetch(self, *args, **kwargs)
        except TimeoutError:
            empty.append(1)
            raise

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", counted)
    return empty


def noting_subscriptions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The MQTT topics subscribed to (once the broker has acknowledged each)."""
    topics: list[str] = []
    subscribe = aiomqtt.Client.subscribe

    async def noted(self: aiomqtt.Client, topic: Any, *args: Any, **kwargs: Any) -> Any:
        answer = await subscribe(self, topic, *args, **kwargs)
        topics.append(str(topic))
        return answer

    monkeypatch.setattr(aiomqtt.Client, "subscribe", noted)
    return topics


def test_every_broker_has_a_consumer_with_its_configuration_above_it() -> None:
    types = []
    for block in CONSUMERS:
        destinations = tomllib.loads(toml_above(block, BLOCKS).text)["destinations"]
        types += [table["type"] for table in destinations.values()]
    assert sorted(types) == ["amqp", "mqtt", "nats"], [block.name for block in CONSUMERS]


@pytest.mark.slow
@pytest.mark.parametrize("block", CONSUMERS, ids=lambda block: block.name)
async def test_the_consumer_receives_an_event_the_relay_publishes(
    engine: AsyncEngine, database_url: str, block: Block, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = uuid.uuid4().hex[:10]
    configuration = toml_above(block, BLOCKS).text
    [broker] = [table["type"] for table in tomllib.loads(configuration)["destinations"].values()]
    await reachable(broker)
    destinations = tomllib.loads(with_placeholders_filled(localised(configuration, broker, run)))[
        "destinations"
    ]
    code = localised(block.text, broker, run).replace("timeout=5", SHORT_FETCH)
    namespace: dict[str, Any] = {"__name__": "snippet"}
    exec(compile(code, block.name, "exec"), namespace)
    got: list[tuple[dict[str, Any], Any]] = []

    async def handle(envelope: dict[str, Any], headers: Any) -> None:
        got.append((envelope, headers))
        raise Received

    empty_fetches = counting_fetches(monkeypatch)
    subscriptions = noting_subscriptions(monkeypatch)
    namespace["handle"] = handle  # the reader's own handle()
    consumer = asyncio.create_task(namespace["consume"]())
    settings = quick_settings(database_url, destinations, redis_url=REDIS_URL)
    async with cleaned_up(broker, run):
        try:
            if broker == "nats":
                await eventually(
                    lambda: len(empty_fetches) >= EMPTY_FETCHES or consumer.done(), timeout=60
                )
            if broker == "mqtt":
                await eventually(lambda: subscriptions or consumer.done())
            if consumer.done():
                consumer.result()  # raises what stopped it
                pytest.fail("the consumer returned before any event was posted")
            runtime = await start(settings)
            async with serving(runtime) as client, worker_on(settings, engine):
                [event_id] = await post_events(client, 1)
                await eventually(lambda: consumer.done(), timeout=30)
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
    with contextlib.suppress(Received):
        consumer.result()
    [(envelope, headers)] = got
    assert envelope["id"] == event_id
    assert headers["webhook-id"] == event_id
    assert headers["kind"] == envelope["kind"]
