"""The ``amqp`` destination against the machine's RabbitMQ, in a vhost of the test run's own:
what a message carries (read back with aio-pika), publisher confirms (an unroutable message,
a nack, a missing exchange are failed attempts), one shared connection replaced after the
broker closed it, a broker down or silent, a real relay worker, and the broker unusable for a
while with nothing lost. The bench kit (``scripts/broker_amqp.py``) is exercised too."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from aio_pika import DeliveryMode
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from relay.destinations import (
    Destination,
    Outcome,
    build_destination,
    envelope_bytes,
    generate_secret,
)
from relay.destinations.amqp import AmqpDestination
from relay.destinations.amqp_config import AmqpDestinationConfig
from relay.destinations.templates import NameTemplate
from relay.outbox.tables import PENDING
from relay.server.runtime import start
from relay.settings import Settings
from relay.store import inspect
from scripts import broker_amqp
from tests.amqp_support import (
    Rabbit,
    amqp_config,
    listing,
    outbound,
    rabbit_on,
    rabbitmqctl,
    relay_connections,
    vhost_of_the_test,
    vhost_url,
)
from tests.conftest import REDIS_URL
from tests.test_relay_e2e import (
    all_succeeded,
    eventually,
    post_events,
    quick_settings,
    serving,
    worker_on,
)

SECRET = generate_secret()
PASSWORD = "pw-that-must-not-leak-7f3a"


Make = Callable[[AmqpDestinationConfig], AmqpDestination]


@pytest.fixture
async def make_destination() -> AsyncIterator[Make]:
    """Builds destinations; closes them after the test."""
    made: list[AmqpDestination] = []

    def make(config: AmqpDestinationConfig) -> AmqpDestination:
        made.append(AmqpDestination("rabbit", config))
        return made[-1]

    yield make
    for destination in made:
        await destination.aclose()


@pytest.fixture(autouse=True)
def _no_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RELAY_") and not name.startswith("RELAY_TEST_"):
            monkeypatch.delenv(name)


def text_headers(headers: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in headers.items()}


# --- what a message carries -------------------------------------------------------------


async def test_envelope_message_is_persistent_signed_and_declared(
    rabbit: Rabbit, make_destination: Make
) -> None:
    exchange, queue = rabbit.name("events"), rabbit.name("crm")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    template = "callbacks.{kind}.{source}.{event}"
    destination = make_destination(
        amqp_config(
            rabbit.url,
            exchange=exchange,
            routing_key=template,
            declare={"queue": queue, "binding_key": "callbacks.#"},
            secret=SECRET,
        )
    )
    event = outbound(1, source="eu-west")
    outcome = await destination.deliver(event, timeout=5)
    assert outcome == Outcome(ok=True, duration_ms=outcome.duration_ms)
    assert outcome.duration_ms > 0

    [message] = await rabbit.messages(queue, 1)
    assert message.body == envelope_bytes(event)
    assert message.exchange == exchange
    assert message.routing_key == NameTemplate(template).render(event)
    assert message.routing_key == "callbacks.conversations.status.eu-west.messagestatus__delivered"
    assert message.message_id == event.event_id
    assert message.delivery_mode == DeliveryMode.PERSISTENT
    assert message.content_type == "application/json"
    assert message.app_id == "callback-relay"
    headers = text_headers(message.headers)
    assert headers["webhook-id"] == event.event_id
    assert headers["kind"] == "conversations.status"
    assert headers["source"] == "eu-west"
    assert headers["event"] == "messagestatus::delivered"
    assert headers["content-type"] == "application/json"
    assert message.timestamp == datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    Webhook(SECRET).verify(message.body, headers)  # raises if the signature does not verify

    vhost = rabbit.vhost
    assert {"name": exchange, "type": "topic", "durable": True} in listing(
        "exchanges", vhost, "name", "type", "durable"
    )
    assert {"name": queue, "durable": True} in listing("queues", vhost, "name", "durable")
    assert {"source_name": exchange, "destination_name": queue, "routing_key": "callbacks.#"} in (
        listing("bindings", vhost, "source_name", "destination_name", "routing_key")
    )


async def test_raw_format_sends_the_platform_body_and_its_content_type(
    rabbit: Rabbit, make_destination: Make
) -> None:
    exchange, queue = rabbit.name("raw"), rabbit.name("raw-q")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    destination = make_destination(
        amqp_config(
            rabbit.url,
            exchange=exchange,
            routing_key="{kind}.{id}",
            format="raw",
            declare={"exchange_type": "fanout", "queue": queue},
        )
    )
    posted = outbound(2, kind="sms.dlr", raw_body=b"\xff\x00binary\r\n", content_type="x/bin")
    got = outbound(
        3,
        kind="sms.dlr",
        raw_body=b"status=DELIVERED&to=%2B4917",
        content_type=None,
        method="GET",
    )
    long_type = "application/x-" + "\u00e9" * 240  # 255 characters, 494 bytes of UTF-8
    typed = outbound(4, raw_body=b"{}", content_type=long_type)
    for event in (posted, got, typed):
        assert (await destination.deliver(event, timeout=5)).ok

    first, second, third = await rabbit.messages(queue, 3)
    assert (first.body, first.content_type) == (posted.raw_body, "x/bin")
    assert (second.body, second.content_type) == (got.raw_body, "application/x-www-form-urlencoded")
    assert first.routing_key == f"sms.dlr.{posted.event_id}"
    assert text_headers(second.headers)["webhook-id"] == got.event_id
    assert "webhook-signature" not in second.headers  # no secret, no signature
    # a content type beyond the property's 255 bytes is cut there; the header keeps it whole
    assert third.content_type == long_type.encode()[:255].decode(errors="ignore")
    assert text_headers(third.headers)["content-type"] == long_type
    assert {"name": exchange, "type": "fanout", "durable": True} in listing(
        "exchanges", rabbit.vhost, "name", "type", "durable"
    )


async def test_broker_exchanges_are_used_not_declared(
    rabbit: Rabbit, make_destination: Make
) -> None:
    """``amq.topic`` exists in every vhost and cannot be declared (the broker would refuse):
    only the queue is; the default exchange ``""`` routes by queue name."""
    queue = rabbit.name("from-amq-topic")
    rabbit.expect(queues=(queue,))
    via_amq = make_destination(
        amqp_config(
            rabbit.url,
            exchange="amq.topic",
            routing_key=f"{rabbit.prefix}.{{kind}}",
            declare={"queue": queue, "binding_key": f"{rabbit.prefix}.#"},
        )
    )
    direct = rabbit.name("direct")
    await rabbit.queue(direct)
    via_default = make_destination(amqp_config(rabbit.url, exchange="", routing_key=direct))

    event = outbound(4)
    assert (await via_amq.deliver(event, timeout=5)).ok
    assert (await via_default.deliver(event, timeout=5)).ok
    [routed] = await rabbit.messages(queue, 1)
    [by_name] = await rabbit.messages(direct, 1)
    assert routed.routing_key == f"{rabbit.prefix}.conversations.status"
    assert routed.body == by_name.body == envelope_bytes(event)


async def test_hostile_values_stay_out_of_names_and_headers(
    rabbit: Rabbit, make_destination: Make
) -> None:
    """Payload values cannot add routing-key separators or wildcards; header values stay on
    one line; names with the AMQP client's punctuation work."""
    exchange, queue = rabbit.name("ex @#,/+ :."), rabbit.name("q @#,/+ :.")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    destination = make_destination(
        amqp_config(
            rabbit.url,
            exchange=exchange,
            routing_key="{kind}.{event}.{platform_id}",
            declare={"queue": queue, "binding_key": "conversations.status.*.*"},
        )
    )
    event = outbound(
        5,
        source="src\r\nX-Evil: 1",
        payload={"messageId": "a.b.#.*", "event": "X.*.# bcc: evil"},
    )
    assert (await destination.deliver(event, timeout=5)).ok
    [message] = await rabbit.messages(queue, 1)
    assert message.routing_key == NameTemplate("{kind}.{event}.{platform_id}").render(event)
    assert message.routing_key == "conversations.status.x_____bcc__evil.a_b____"
    headers = text_headers(message.headers)
    assert all(value.isprintable() for value in headers.values())
    assert headers["source"] == "src__X-Evil: 1"
    assert headers["event"] == "x.*.# bcc: evil"


@pytest.mark.parametrize(
    "fields",
    [
        {"exchange": "événements"},
        {"exchange": "x" * 200},
        {"exchange": "ok", "declare": {"queue": "queue'with'quotes"}},
    ],
)
def test_a_name_the_client_cannot_send_is_refused_by_the_settings(fields: dict[str, Any]) -> None:
    """RabbitMQ takes 255 bytes of UTF-8, but aio-pika's frame library sends only 127
    characters of ``[A-Za-z0-9-_.:@#,/+ ]``: such a destination could never deliver."""
    with pytest.raises(ValueError, match="at most 127 characters"):
        amqp_config("amqp://guest:guest@127.0.0.1:5672/", **fields)


# --- confirms: what is not taken is a failure --------------------------------------------


async def test_unroutable_message_is_a_failed_attempt(
    rabbit: Rabbit, make_destination: Make
) -> None:
    exchange = rabbit.name("nobody-bound")
    await rabbit.exchange(exchange)
    destination = make_destination(amqp_config(rabbit.url, exchange=exchange))
    outcome = await destination.deliver(outbound(7, source="eu"), timeout=5)
    assert not outcome.ok and not outcome.down  # its routing key's: not the broker's down
    assert outcome.error == (
        f"unroutable: no queue bound to exchange {exchange!r} "
        "for routing key 'conversations.status.eu'"
    )
    # a returned message leaves the channel open: once a queue is bound, the same object
    # delivers
    queue = rabbit.name("bound-later")
    await rabbit.queue(queue, exchange)
    event = outbound(8)
    assert (await destination.deliver(event, timeout=5)).ok
    [message] = await rabbit.messages(queue, 1)
    assert message.message_id == event.event_id


async def test_nacked_message_is_a_failed_attempt(rabbit: Rabbit, make_destination: Make) -> None:
    """A queue that refuses new messages when full makes the broker nack the publish."""
    exchange, queue = rabbit.name("full"), rabbit.name("full-q")
    await rabbit.exchange(exchange)
    await rabbit.queue(
        queue, exchange, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    destination = make_destination(amqp_config(rabbit.url, exchange=exchange))
    outcome = await destination.deliver(outbound(9), timeout=5)
    assert (outcome.ok, outcome.error) == (False, "not confirmed: the broker nacked the message")
    assert outcome.down  # a full queue: the broker cannot take messages now


async def test_missing_exchange_fails_then_a_new_channel_delivers(
    rabbit: Rabbit, make_destination: Make
) -> None:
    """Publishing to a missing exchange makes the broker close the channel (404): the attempt
    fails with the broker's words, and the next one opens a new channel on the same
    connection."""
    exchange = rabbit.name("created-later")
    destination = make_destination(amqp_config(rabbit.url, exchange=exchange))
    for number in (10, 11):  # twice: the closed channel is noticed and replaced each time
        outcome = await destination.deliver(outbound(number), timeout=5)
        assert not outcome.ok and not outcome.down  # the broker answered the publish
        assert outcome.error is not None
        assert f"NOT_FOUND - no exchange {exchange!r} in vhost {rabbit.vhost!r}" in outcome.error

    queue = rabbit.name("created-later-q")
    await rabbit.exchange(exchange)
    await rabbit.queue(queue, exchange)
    event = outbound(12)
    assert (await destination.deliver(event, timeout=5)).ok
    [message] = await rabbit.messages(queue, 1)
    assert message.message_id == event.event_id
    assert relay_connections(rabbit.vhost) == 1


async def test_a_declaration_the_broker_refuses_is_a_failed_attempt(
    rabbit: Rabbit, make_destination: Make
) -> None:
    """An exchange that exists with another type: the declaration's error, every attempt."""
    exchange = rabbit.name("is-direct")
    await rabbit.exchange(exchange, "direct")
    destination = make_destination(
        amqp_config(rabbit.url, exchange=exchange, declare={"exchange_type": "topic"})
    )
    await destination.start()  # refused by the broker, which may change: not a refusal here
    for number in (13, 14):
        outcome = await destination.deliver(outbound(number), timeout=5)
        assert not outcome.ok and not outcome.down  # a channel-level answer
        assert outcome.error is not None
        assert "PRECONDITION_FAILED - inequivalent arg 'type'" in outcome.error


# --- the connection ----------------------------------------------------------------------


def test_the_factory_builds_it_as_a_destination(amqp_vhost: tuple[str, str]) -> None:
    built = build_destination("rabbit", amqp_config(amqp_vhost[1], exchange="callbacks"))
    assert isinstance(built, AmqpDestination)
    assert isinstance(built, Destination)
    assert built.name == "rabbit"


async def test_start_connects_and_declares_and_aclose_closes(
    rabbit: Rabbit, make_destination: Make
) -> None:
    exchange, queue = rabbit.name("at-start"), rabbit.name("at-start-q")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    destination = make_destination(
        amqp_config(rabbit.url, exchange=exchange, declare={"queue": queue})
    )
    await destination.start()
    assert {"name": queue} in listing("queues", rabbit.vhost, "name")
    assert relay_connections(rabbit.vhost) == 1
    await destination.aclose()
    await eventually(lambda: relay_connections(rabbit.vhost) == 0, timeout=10)


async def test_concurrent_deliveries_share_one_connection(
    rabbit: Rabbit, make_destination: Make
) -> None:
    exchange, queue = rabbit.name("shared"), rabbit.name("shared-q")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    destination = make_destination(
        amqp_config(rabbit.url, exchange=exchange, declare={"queue": queue})
    )
    events = [outbound(n) for n in range(200)]
    outcomes = await asyncio.gather(*(destination.deliver(e, timeout=10) for e in events))
    assert all(o.ok for o in outcomes), {o.error for o in outcomes}
    messages = await rabbit.messages(queue, len(events))
    assert sorted(m.message_id or "" for m in messages) == sorted(e.event_id for e in events)
    assert relay_connections(rabbit.vhost) == 1


async def test_connection_closed_by_the_broker_is_replaced_by_the_next_attempt(
    rabbit: Rabbit, make_destination: Make
) -> None:
    exchange, queue = rabbit.name("reconnect"), rabbit.name("reconnect-q")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    destination = make_destination(
        amqp_config(rabbit.url, exchange=exchange, declare={"queue": queue})
    )
    assert (await destination.deliver(outbound(20), timeout=5)).ok
    await rabbit.messages(queue, 1)

    for round_ in range(2):  # and once more: the replacement is replaced too
        await asyncio.to_thread(
            rabbitmqctl, "close_all_connections", "-p", rabbit.vhost, "test: forced close"
        )
        outcomes = await attempts_until_success(destination, first_number=30 + 10 * round_)
        assert all(not o.ok for o in outcomes[:-1])
        # the test's own connection was closed too: read with a new one
        async with rabbit_on(rabbit.vhost, rabbit.url) as reader:
            await reader.messages(queue, 1)
    assert relay_connections(rabbit.vhost) == 1


async def attempts_until_success(
    destination: AmqpDestination, first_number: int, tries: int = 50
) -> list[Outcome]:
    """Deliver until an attempt succeeds (at most ``tries``); every outcome."""
    outcomes: list[Outcome] = []
    for number in range(first_number, first_number + tries):
        outcomes.append(await destination.deliver(outbound(number), timeout=5))
        if outcomes[-1].ok:
            return outcomes
        await asyncio.sleep(0.1)
    raise AssertionError(f"no success in {tries} attempts: {[o.error for o in outcomes]}")


@pytest.mark.slow
async def test_connection_closed_under_load_confirms_only_what_the_broker_took(
    rabbit: Rabbit, make_destination: Make
) -> None:
    """Publishes keep flowing while the broker closes the connection: the attempts caught in
    it fail (without raising), later ones succeed on a new connection, and every attempt
    reported ok is in the queue."""
    vhost, url = rabbit.vhost, rabbit.url
    exchange, queue = rabbit.name("load"), rabbit.name("load-q")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    destination = make_destination(amqp_config(url, exchange=exchange, declare={"queue": queue}))
    results: list[tuple[str, Outcome]] = []
    closed = asyncio.Event()
    after_close = 0

    async def publisher(worker: int) -> None:
        nonlocal after_close
        for number in range(5000):  # bounded: a destination that never recovers fails the test
            if after_close >= 200:
                return
            event = outbound(worker * 100_000 + number)
            outcome = await destination.deliver(event, timeout=5)
            results.append((event.event_id, outcome))
            if closed.is_set() and outcome.ok:
                after_close += 1

    publishers = [asyncio.create_task(publisher(w)) for w in range(20)]
    await eventually(lambda: len(results) > 500, timeout=20)
    await asyncio.to_thread(rabbitmqctl, "close_all_connections", "-p", vhost, "test: under load")
    closed.set()
    await asyncio.wait_for(asyncio.gather(*publishers), timeout=30)
    assert after_close >= 200

    failed = [outcome.error for _, outcome in results if not outcome.ok]
    confirmed = {event_id for event_id, outcome in results if outcome.ok}
    print(f"{len(results)} attempts, {len(failed)} failed by the close: {sorted(set(failed))}")
    async with rabbit_on(vhost, url) as reader:
        handle = await reader.channel.get_queue(queue, ensure=False)
        in_queue: set[str] = set()
        while (message := await handle.get(no_ack=True, fail=False)) is not None:
            in_queue.add(message.message_id or "")
    assert confirmed <= in_queue
    assert all(error and "guest:guest" not in error for error in failed)


# --- a broker that is down, silent or refusing -------------------------------------------


async def test_silent_broker_times_out_within_the_timeout(make_destination: Make) -> None:
    """A server that accepts the connection and never answers: the attempt ends at its
    timeout, and so does start()."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        url = f"amqp://guest:{PASSWORD}@127.0.0.1:{port}/"
        destination = make_destination(amqp_config(url, exchange="callbacks", timeout="500ms"))
        began = time.monotonic()
        await destination.start()
        assert time.monotonic() - began < 1.5
        began = time.monotonic()
        outcome = await destination.deliver(outbound(42), timeout=0.5)
        assert (outcome.ok, outcome.error, outcome.down) == (False, "timeout after 0.5s", True)
        assert time.monotonic() - began < 1.5
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("problem", "expected"),
    [
        ("password", "ProbableAuthenticationError: ACCESS_REFUSED - Login was refused"),
        ("vhost", "the broker refused to open vhost 'relay-test-missing'"),
    ],
)
async def test_broker_refusing_the_login_or_vhost_is_a_clear_failure(
    amqp_vhost: tuple[str, str],
    make_destination: Make,
    caplog: pytest.LogCaptureFixture,
    problem: str,
    expected: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    vhost, _ = amqp_vhost
    if problem == "password":
        url = vhost_url(vhost, password=PASSWORD)
    else:
        url = vhost_url("relay-test-missing")
    destination = make_destination(amqp_config(url, exchange="callbacks"))
    await destination.start()
    outcome = await destination.deliver(outbound(43), timeout=5)
    assert not outcome.ok and outcome.down  # no connection: no message can go
    assert outcome.error is not None
    assert outcome.error.startswith(expected)
    assert PASSWORD not in outcome.error
    assert PASSWORD not in caplog.text


# --- through a relay worker ---------------------------------------------------------------


def relay_settings(database_url: str, destination: dict[str, Any]) -> Settings:
    """Relay settings on the machine's Redis with one destination, ``rabbit`` (2 s timeout,
    retried every second)."""
    table = {"timeout": "2s", **destination}
    return quick_settings(
        database_url, {"rabbit": table}, first_retry="1s", then="1s", redis_url=REDIS_URL
    )


async def deliveries(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await inspect.list_deliveries(engine, limit=10_000)


@pytest.mark.slow
async def test_events_posted_to_relay_serve_arrive_once_each_through_a_worker(
    engine: AsyncEngine, database_url: str, redis: Redis, rabbit: Rabbit
) -> None:
    exchange, queue = rabbit.name("relay"), rabbit.name("relay-q")
    rabbit.expect(exchanges=(exchange,), queues=(queue,))
    settings = relay_settings(
        database_url,
        {
            "type": "amqp",
            "url": rabbit.url,
            "exchange": exchange,
            "declare": {"queue": queue},
            "secret": SECRET,
        },
    )
    runtime = await start(settings)
    async with serving(runtime) as client, worker_on(settings, engine):
        ids = await post_events(client, 15)
        await eventually(lambda: all_succeeded(engine, 15))
    messages = await rabbit.messages(queue, 15)  # and no sixteenth
    assert sorted(m.message_id or "" for m in messages) == sorted(ids)
    for message in messages:
        headers = text_headers(message.headers)
        Webhook(SECRET).verify(message.body, headers)
        assert message.routing_key == f"{headers['kind']}.default"
    assert {r["attempts"] for r in await deliveries(engine)} == {1}


@pytest.mark.slow
async def test_broker_unusable_for_a_while_loses_nothing(
    engine: AsyncEngine, database_url: str, redis: Redis
) -> None:
    """The vhost's permissions are cleared and its connections closed (the kit's chaos
    fault) while events are posted: their attempts fail and wait under the policy; once
    access is back, every event arrives, read by the kit's consumer that ran throughout.
    Duplicates are allowed (at-least-once) and reported."""
    name = "relay-fault"
    async with vhost_of_the_test() as (_, url):
        await broker_amqp.prepare(url, name)
        # the kit's consumer runs through the outage, as in the chaos run
        consumer = asyncio.create_task(broker_amqp.consume(url, name, 30, timeout=30))
        settings = relay_settings(database_url, broker_amqp.destination(url, name))
        runtime = await start(settings)
        try:
            async with serving(runtime) as client, worker_on(settings, engine):
                ids = await post_events(client, 10)
                await asyncio.to_thread(broker_amqp.break_access, url)
                broken = await post_events(client, 20)
                ids |= broken

                async def retried_while_broken() -> bool:
                    rows = [r for r in await deliveries(engine) if r["event_id"] in broken]
                    return len(rows) == len(broken) and all(
                        r["status"] == PENDING and r["attempts"] >= 2 for r in rows
                    )

                await eventually(retried_while_broken, timeout=30)
                errors = {r["last_error"] for r in await deliveries(engine) if r["last_error"]}
                await asyncio.to_thread(broker_amqp.restore_access, url)
                await eventually(lambda: all_succeeded(engine, 30), timeout=60)
        finally:
            await asyncio.to_thread(broker_amqp.restore_access, url)
        received = await asyncio.wait_for(consumer, timeout=60)
        await broker_amqp.cleanup(url, name)
    arrived = [webhook_id for webhook_id, _ in received]
    duplicates = len(arrived) - len(set(arrived))
    print(f"fault: {len(ids)} events, {duplicates} duplicates, errors while broken: {errors}")
    assert set(arrived) == ids
    assert errors and all("refused to open vhost" in e or "closed" in e for e in errors), errors
    assert duplicates <= 10  # at most the events in flight when access was cut


# --- the bench/chaos kit -------------------------------------------------------------------


async def test_kit_prepares_publishes_consumes_and_cleans_up(
    amqp_vhost: tuple[str, str],
) -> None:
    vhost, url = amqp_vhost
    name = f"kit-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    table = broker_amqp.destination(url, name)
    config = amqp_config(**{k: v for k, v in table.items() if k != "type"})
    assert (config.exchange, config.format) == (name, "envelope")

    await broker_amqp.prepare(url, name)
    try:
        consumer = asyncio.create_task(broker_amqp.consume(url, name, 60, timeout=5))
        await asyncio.sleep(0.2)  # the consumer may start before anything is published
        messages = [
            (f"id-{n}", f'{{"n":{n}}}'.encode(), {"webhook-id": f"id-{n}", "kind": "sms.dlr"})
            for n in range(50)
        ]
        confirmed = await broker_amqp.publish(url, name, messages, concurrency=8)
        assert len(confirmed) == 50
        assert all(t > 0 for t in confirmed)
        # and the relay's destination, built from the kit's table, publishes to the same place
        relay = AmqpDestination("kit", config)
        try:
            events = [outbound(n) for n in range(10)]
            assert all([(await relay.deliver(e, timeout=5)).ok for e in events])
        finally:
            await relay.aclose()
        received = await consumer
        assert {i for i, _ in received} == {f"id-{n}" for n in range(50)} | {
            e.event_id for e in events
        }
        assert all(abs(at - time.time()) < 60 for _, at in received)
    finally:
        await broker_amqp.cleanup(url, name)
    assert {"name": name} not in listing("queues", vhost, "name")
    assert {"name": name} not in listing("exchanges", vhost, "name")


def test_kit_refuses_the_default_vhost() -> None:
    for control in (broker_amqp.break_access, broker_amqp.drop_vhost):
        with pytest.raises(ValueError, match="default vhost"):
            control("amqp://guest:guest@127.0.0.1:5672/")
        with pytest.raises(ValueError, match="default vhost"):
            control("amqp://guest:guest@127.0.0.1:5672")


async def test_the_url_can_name_the_connection(rabbit: Rabbit, make_destination: Make) -> None:
    exchange, queue = rabbit.name("named-x"), rabbit.name("named-q")
    await rabbit.exchange(exchange)
    await rabbit.queue(queue, exchange)
    url = f"{rabbit.url}?name=orders%20relay"
    destination = make_destination(amqp_config(url, exchange=exchange))
    assert (await destination.deliver(outbound(1), timeout=5)).ok
    rows = json.loads(
        rabbitmqctl("list_connections", "vhost", "client_properties", "--formatter", "json")
    )
    names = [
        value
        for row in rows
        if row["vhost"] == rabbit.vhost
        for key, _, value in row["client_properties"]
        if key == "connection_name"
    ]
    assert names == ["orders relay"]
