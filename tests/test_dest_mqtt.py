"""The ``mqtt`` destination against real Mosquitto brokers: the machine's (127.0.0.1:1883,
anonymous) and private ``mosquitto`` processes (with an ACL, with a password file, stopped,
paused, killed). Messages are read back by aiomqtt subscribers (MQTT 5)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks.webhooks import Webhook

from relay.destinations import parse_destination_config
from relay.destinations.mqtt import CLIENT_ID_PREFIX, MqttDestination
from relay.destinations.mqtt_config import MqttDestinationConfig
from relay.destinations.outbound import FORM_CONTENT_TYPE, envelope_bytes
from relay.destinations.signing import generate_secret
from relay.outbox.tables import SUCCEEDED
from relay.server.runtime import start
from relay.settings import Settings
from relay.store import inspect
from scripts import broker_mqtt
from tests.conftest import REDIS_URL
from tests.mqtt_support import (
    MQTT_URL,
    PrivateBroker,
    check_shared_broker,
    content_type,
    mosquitto_passwd,
    mqtt_client,
    private_broker,
    session_present,
    subscribed,
    unique_root,
    user_properties,
)
from tests.test_destinations import EVENT_ID, outbound
from tests.test_relay_e2e import (
    all_succeeded,
    eventually,
    post_events,
    quick_settings,
    serving,
    worker_on,
)

SECRET = generate_secret()
PASSWORD = "pw-that-must-not-leak-7d2f"


@pytest.fixture
async def shared_broker() -> None:
    """The machine's broker; missing: fails under CI=true, skipped otherwise."""
    await check_shared_broker()


@pytest.fixture
def root(shared_broker: None) -> str:
    """A topic root of this test's own on the machine's broker."""
    return unique_root()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    """A private Mosquitto (anonymous) on a free port."""
    with private_broker(tmp_path) as running:
        yield running


def mqtt_config(topic: str, url: str = MQTT_URL, **options: Any) -> MqttDestinationConfig:
    return MqttDestinationConfig(type="mqtt", url=url, topic=topic, **options)


@asynccontextmanager
async def destination(config: MqttDestinationConfig) -> AsyncIterator[MqttDestination]:
    """A started destination, closed afterwards."""
    sender = MqttDestination("events", config)
    try:
        await sender.start()
        yield sender
    finally:
        await sender.aclose()


# --- publishing and reading back ----------------------------------------------------------------


@pytest.mark.parametrize(("body_format", "qos"), [("envelope", 1), ("raw", 2), ("envelope", 2)])
async def test_published_with_properties_and_signature(
    root: str, body_format: str, qos: int
) -> None:
    config = mqtt_config(
        f"{root}/{{kind}}/{{source}}/{{event}}", secret=SECRET, format=body_format, qos=qos
    )
    event = outbound()
    async with subscribed(f"{root}/#", qos) as subscriber, destination(config) as sender:
        outcome = await sender.deliver(event, timeout=5)
        [message] = await subscriber.wait_for(1)

    assert outcome.ok and outcome.error is None and outcome.duration_ms > 0
    assert message.topic.value == f"{root}/conversations.status/default/messagestatus__delivered"
    assert message.qos == qos and message.retain is False
    properties = user_properties(message)
    assert isinstance(message.payload, bytes)
    if body_format == "envelope":
        assert message.payload == envelope_bytes(event)
        assert json.loads(message.payload)["id"] == EVENT_ID
        assert content_type(message) == "application/json"
    else:
        assert message.payload == event.raw_body
        assert content_type(message) == "application/json; charset=utf-8"
    assert "content-type" not in properties  # it is the message's own content type
    assert properties["webhook-id"] == EVENT_ID
    assert properties["kind"] == "conversations.status"
    assert properties["source"] == "default"
    assert properties["event"] == "messagestatus::delivered"
    assert abs(int(properties["webhook-timestamp"]) - time.time()) < 60
    headers = properties | {"content-type": content_type(message) or ""}
    assert Webhook(SECRET).verify(message.payload, headers) == json.loads(message.payload)


async def test_nothing_is_retained(root: str) -> None:
    """A subscriber arriving after the publish gets nothing: retain is off."""
    async with destination(mqtt_config(f"{root}/{{kind}}")) as sender:
        assert (await sender.deliver(outbound(), timeout=5)).ok
    async with subscribed(f"{root}/#", 1) as late:
        await asyncio.sleep(0.5)
    assert late.messages == []


async def test_a_get_callback_raw_is_form_encoded_and_without_secret_unsigned(root: str) -> None:
    event = outbound(method="GET", raw_body=b"status=DELIVERED&to=%2B15550100", content_type=None)
    async with subscribed(f"{root}/#", 1) as subscriber:
        async with destination(mqtt_config(f"{root}/{{kind}}", format="raw")) as sender:
            assert (await sender.deliver(event, timeout=5)).ok
        [message] = await subscriber.wait_for(1)
    assert message.payload == b"status=DELIVERED&to=%2B15550100"
    assert content_type(message) == FORM_CONTENT_TYPE
    assert "webhook-signature" not in user_properties(message)


async def test_hostile_event_values_cannot_add_levels_or_wildcards(root: str) -> None:
    hostile = {"messageId": "m/+/#", "event": "A/b # +$", "channel": "SMS"}
    event = outbound(payload=hostile, source="de\r\nfault/#", raw_body=b"{}")
    config = mqtt_config(f"{root}/{{source}}/{{event}}/{{platform_id}}")
    async with subscribed(f"{root}/#", 1) as subscriber, destination(config) as sender:
        outcome = await sender.deliver(event, timeout=5)
        [message] = await subscriber.wait_for(1)
    assert outcome.ok, outcome.error
    assert message.topic.value == f"{root}/de__fault__/a_b_____/m____"
    properties = user_properties(message)
    assert properties["event"] == "a/b # +$" and properties["source"] == "de__fault/#"


async def test_concurrent_deliveries_share_one_connection(broker: PrivateBroker) -> None:
    ids = [f"0190f0a8-4444-7000-8000-{n:012d}" for n in range(60)]
    async with subscribed("events/#", 1, broker.url) as subscriber:
        async with destination(mqtt_config("events/{kind}", url=broker.url)) as sender:
            outcomes = await asyncio.gather(
                *(sender.deliver(outbound(event_id=i), timeout=5) for i in ids)
            )
            assert sender.client_id.startswith(CLIENT_ID_PREFIX)
            assert broker.connections(sender.client_id) == 1
        messages = await subscriber.wait_for(len(ids))
    assert all(o.ok for o in outcomes), {o.error for o in outcomes}
    assert sorted(user_properties(m)["webhook-id"] for m in messages) == ids


async def test_the_configured_client_id_prefix_is_used(broker: PrivateBroker) -> None:
    config = mqtt_config("events/{kind}", url=broker.url, client_id_prefix="relay-worker-")
    async with destination(config) as sender:
        assert sender.client_id.startswith("relay-worker-")
        assert len(sender.client_id) == len("relay-worker-") + 16
        assert broker.connections(sender.client_id) == 1  # start() connected
        assert (await sender.deliver(outbound(), timeout=5)).ok
    assert broker.connections(sender.client_id) == 1
    assert broker.connections(CLIENT_ID_PREFIX) == 0


@pytest.mark.parametrize("qos", [1, 2])
async def test_publish_returns_only_once_the_broker_acknowledged(
    broker: PrivateBroker, qos: int
) -> None:
    """A paused broker holds the PUBACK (PUBREC, PUBCOMP) back: the attempt waits for it (and
    times out); the broker resumed, an attempt on the same connection succeeds."""
    config = mqtt_config("events/{kind}", url=broker.url, qos=qos)
    async with destination(config) as sender:
        assert (await sender.deliver(outbound(), timeout=5)).ok  # connected
        broker.pause()
        began = time.monotonic()
        held = await sender.deliver(outbound(attempt=2), timeout=0.5)
        waited = time.monotonic() - began
        broker.resume()
        after = await sender.deliver(outbound(attempt=3), timeout=5)
    assert (held.ok, held.error, held.down) == (False, "timeout after 0.5s", True)
    assert 0.5 <= waited < 2
    assert after.ok
    assert broker.connections(CLIENT_ID_PREFIX) == 1


# --- what cannot succeed ------------------------------------------------------------------------


ACL = "topic readwrite allowed/#\n"


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    """A private Mosquitto whose ACL lets anyone publish under ``allowed/`` only."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    with private_broker(tmp_path, f"acl_file {acl}") as running:
        yield running


async def test_a_publish_the_acl_denies_is_a_failed_attempt(acl_broker: PrivateBroker) -> None:
    """Mosquitto answers a denied QoS 1 publish with PUBACK 0x87 (Not authorized): a failure,
    and the connection stays usable."""
    url = acl_broker.url
    async with subscribed("#", 1, url) as subscriber:
        async with destination(mqtt_config("denied/{kind}", url=url)) as denied_sender:
            denied = await denied_sender.deliver(outbound(), timeout=5)
            again = await denied_sender.deliver(outbound(attempt=2), timeout=5)
        async with destination(mqtt_config("allowed/{kind}", url=url)) as allowed_sender:
            allowed = await allowed_sender.deliver(outbound(), timeout=5)
        [message] = await subscriber.wait_for(1)
    assert (denied.ok, denied.error, denied.down) == (
        False,
        "the broker refused the message: Not authorized (0x87)",
        False,  # a refusal of this topic: not the broker's down
    )
    assert (again.ok, again.error) == (denied.ok, denied.error)
    assert acl_broker.connections(CLIENT_ID_PREFIX) == 2  # one per destination: no reconnect
    assert allowed.ok and message.topic.value == "allowed/conversations.status"


async def test_a_message_the_broker_disconnects_over_is_that_messages_failure(
    tmp_path: Path,
) -> None:
    """Mosquitto's ``max_packet_size``: a larger PUBLISH gets a DISCONNECT "Packet too large".
    The attempt fails without counting as the broker's down; the next connects again."""
    with private_broker(tmp_path, "max_packet_size 200") as small:
        async with destination(mqtt_config("x/{kind}", url=small.url)) as sender:
            large = await sender.deliver(outbound(), timeout=5)
            again = await sender.deliver(outbound(attempt=2), timeout=5)
    assert (large.ok, large.error, large.down) == (
        False,
        "disconnected by the broker: Packet too large",
        False,
    )
    assert (again.ok, again.error, again.down) == (large.ok, large.error, large.down)


async def test_aiomqtt_publish_waits_for_the_puback_but_hides_its_reason_code(
    acl_broker: PrivateBroker,
) -> None:
    """Why the destination drives paho-mqtt itself, and what the kit's baseline (aiomqtt)
    waits for: aiomqtt's publish returns once the PUBACK came (a paused broker holds it back:
    the publish times out), but returns as well for a PUBACK that refuses the message."""
    url = acl_broker.url
    async with subscribed("#", 1, url) as subscriber, mqtt_client(url) as publisher:
        await publisher.publish("denied/x", b"{}", qos=1)  # PUBACK 0x87, and no error
        await publisher.publish("allowed/x", b"{}", qos=1)
        [message] = await subscriber.wait_for(1)  # the denied one never came
        acl_broker.pause()
        with pytest.raises(aiomqtt.MqttError, match="timed out"):
            await publisher.publish("allowed/y", b"{}", qos=1, timeout=0.5)
        acl_broker.resume()
    assert message.topic.value == "allowed/x"


@pytest.mark.xfail(
    strict=True,
    reason="paho-mqtt 2.2.0 ignores a PUBREC's reason code and sends PUBREL; Mosquitto then "
    "completes the flow with PUBCOMP Success: a denied QoS 2 publish reads as delivered",
)
async def test_a_qos2_publish_the_acl_denies_is_a_failed_attempt(
    acl_broker: PrivateBroker,
) -> None:
    config = mqtt_config("denied/{kind}", url=acl_broker.url, qos=2)
    async with destination(config) as sender:
        outcome = await sender.deliver(outbound(), timeout=5)
    assert not outcome.ok


async def test_a_broker_that_never_answers_fails_within_the_timeout(
    broker: PrivateBroker,
) -> None:
    """A paused broker: the kernel accepts the connection, no CONNACK ever comes. The attempt
    ends at its timeout; once the broker is back, the next attempt connects."""
    sender = MqttDestination("events", mqtt_config("x/{kind}", url=broker.url))
    try:
        broker.pause()
        began = time.monotonic()
        hung = await sender.deliver(outbound(), timeout=0.5)
        waited = time.monotonic() - began
        broker.resume()
        back = await sender.deliver(outbound(attempt=2), timeout=5)
    finally:
        await sender.aclose()
    assert (hung.ok, hung.error, hung.down) == (False, "timeout after 0.5s", True)
    assert 0.5 <= waited < 2
    assert back.ok


@pytest.fixture
def password_broker(tmp_path: Path) -> Iterator[PrivateBroker]:
    """A private Mosquitto that takes user ``relay`` with the password ``p@ss:w/rd %`` only."""
    passwords = tmp_path / "passwords"
    subprocess.run(
        [mosquitto_passwd(), "-b", "-c", str(passwords), "relay", "p@ss:w/rd %"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    with private_broker(tmp_path, "allow_anonymous false", f"password_file {passwords}") as running:
        yield running


async def test_credentials_from_the_url_and_a_wrong_password_without_the_password(
    password_broker: PrivateBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    where = f"127.0.0.1:{password_broker.port}"
    right = MqttDestination(
        "events", mqtt_config("x/{kind}", url=f"mqtt://relay:p%40ss%3Aw%2Frd%20%25@{where}")
    )
    wrong = MqttDestination(
        "events", mqtt_config("x/{kind}", url=f"mqtt://relay:{PASSWORD}@{where}")
    )
    anonymous = MqttDestination("events", mqtt_config("x/{kind}", url=f"mqtt://{where}"))
    try:
        ok = await right.deliver(outbound(), timeout=5)
        await wrong.start()
        refused = await wrong.deliver(outbound(), timeout=5)
        nobody = await anonymous.deliver(outbound(), timeout=5)
    finally:
        for sender in (right, wrong, anonymous):
            await sender.aclose()
    assert ok.ok, ok.error
    assert (refused.ok, refused.error) == (
        False,
        "the broker refused the connection: Not authorized",
    )
    assert (nobody.ok, nobody.error) == (refused.ok, refused.error)
    assert PASSWORD not in caplog.text and "p@ss" not in caplog.text and "p%40ss" not in caplog.text
    assert f"mqtt://{where}" in caplog.text  # the start's warning, without the credentials


async def test_a_broker_that_goes_away_and_comes_back_needs_no_restart(
    broker: PrivateBroker,
) -> None:
    """Stopped: the next attempts fail at once; started again on the same port: the next
    attempt connects again (a new connection) and succeeds."""
    config = mqtt_config("events/{kind}", url=broker.url)
    async with destination(config) as sender:
        before = await sender.deliver(outbound(event_id="before"), timeout=3)
        broker.stop()
        began = time.monotonic()
        dropped = await sender.deliver(outbound(event_id="during"), timeout=3)
        down = await sender.deliver(outbound(event_id="during", attempt=2), timeout=3)
        down_took = time.monotonic() - began
        broker.start()
        async with subscribed("events/#", 1, broker.url) as subscriber:
            back = await sender.deliver(outbound(event_id="during", attempt=3), timeout=3)
            [message] = await subscriber.wait_for(1)
    assert before.ok and back.ok
    # the first attempt may find the connection before the loop read the broker's close
    assert not dropped.ok and dropped.error in ("connection lost", "connection refused")
    assert (down.ok, down.error) == (False, "connection refused") and down_took < 2
    assert user_properties(message)["webhook-id"] == "during"
    assert broker.connections(sender.client_id) == 2


async def test_a_publish_in_flight_when_the_connection_drops_fails_at_once(
    broker: PrivateBroker,
) -> None:
    """Paused (no PUBACK), then killed: the kernel closes the connection and the attempt that
    waited for its acknowledgement fails then, long before its timeout."""
    async with destination(mqtt_config("events/{kind}", url=broker.url)) as sender:
        assert (await sender.deliver(outbound(), timeout=5)).ok
        broker.pause()
        in_flight = asyncio.create_task(sender.deliver(outbound(attempt=2), timeout=10))
        await asyncio.sleep(0.3)
        assert not in_flight.done()
        began = time.monotonic()
        broker.kill()
        dropped = await in_flight
        took = time.monotonic() - began
        broker.start()
        back = await sender.deliver(outbound(attempt=3), timeout=5)
    assert (dropped.ok, dropped.error) == (False, "connection lost")
    assert took < 2
    assert back.ok


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"url": "http://127.0.0.1:1883"}, "url must start with mqtt:// or mqtts://"),
        ({"url": "tcp://127.0.0.1:1883"}, "url must start with mqtt:// or mqtts://"),
        ({"url": ""}, "url must start with"),
        ({"url": "mqtt://"}, "url must name a host"),
        ({"url": "mqtt://:1883"}, "url must name a host"),
        ({"url": "mqtt://127.0.0.1:18x3"}, "invalid port"),
        ({"url": "mqtt://h:1883/?x=1"}, "cannot hold a query"),
        ({"url": "mqtt://h 1883"}, "spaces or control characters"),
        ({"topic": ""}, "cannot be empty"),
        ({"topic": "a/+/{kind}"}, "cannot hold '\\+'"),
        ({"topic": "a/#"}, "cannot hold '#'"),
        ({"topic": "$SYS/{kind}"}, "broker's own"),
        ({"topic": "a/\n{kind}"}, "control characters"),
        ({"topic": "a/{nope}"}, "is not a template field"),
        ({"topic": "a/{kind"}, "is not a valid template"),
        ({"qos": 0}, "qos"),
        ({"client_id_prefix": ""}, "at least 1"),
        ({"client_id_prefix": "relay\n1"}, "printable ASCII"),
        ({"client_id_prefix": "x" * 49}, "at most 48"),
        ({"client_id": "relay-1"}, "Extra inputs"),
    ],
)
def test_hostile_settings_are_refused(changes: dict[str, Any], message: str) -> None:
    data = {"type": "mqtt", "url": MQTT_URL, "topic": "x/{kind}"} | changes
    with pytest.raises(ValidationError, match=message):
        parse_destination_config(data)


def test_an_mqtts_url_defaults_to_port_8883_and_percent_decodes_credentials() -> None:
    from relay.destinations.mqtt import Endpoint

    endpoint = Endpoint.from_url("mqtts://us%3Aer:p%40ss@broker.example")
    assert endpoint == Endpoint("broker.example", 8883, "us:er", "p@ss", tls=True)
    assert Endpoint.from_url("mqtt://h").port == 1883


# --- a relay worker -----------------------------------------------------------------------------


def mqtt_settings(database_url: str, url: str, topic: str, **extra: Any) -> Settings:
    """Relay settings with one ``mqtt`` destination (1 s timeout, retried every second)."""
    table = {"type": "mqtt", "url": url, "topic": topic, "secret": SECRET}
    return quick_settings(database_url, {"events": table}, first_retry="1s", then="1s", **extra)


@pytest.mark.slow
async def test_events_arrive_through_a_relay_worker(
    engine: AsyncEngine, database_url: str, redis: Redis, root: str
) -> None:
    settings = mqtt_settings(
        database_url, MQTT_URL, f"{root}/{{kind}}/{{source}}", redis_url=REDIS_URL
    )
    runtime = await start(settings)
    async with subscribed(f"{root}/#", 1) as subscriber:
        async with serving(runtime) as client, worker_on(settings, engine):
            ids = await post_events(client, 10)
            await eventually(lambda: all_succeeded(engine, 10))
        messages = await subscriber.wait_for(10)
    assert sorted(user_properties(m)["webhook-id"] for m in messages) == sorted(ids)
    for message in messages:
        properties = user_properties(message)
        headers = properties | {"content-type": content_type(message) or ""}
        assert isinstance(message.payload, bytes)
        assert Webhook(SECRET).verify(message.payload, headers)["id"] == properties["webhook-id"]
        assert message.topic.value == f"{root}/{properties['kind']}/default"


@pytest.mark.slow
async def test_broker_stopped_and_started_again_loses_nothing(
    engine: AsyncEngine, database_url: str, redis: Redis, broker: PrivateBroker
) -> None:
    """A subscriber with a persistent session (the kit's: clean start off, an hour's expiry,
    QoS 1) records arrivals. The broker is paused while deliveries are under way, then stopped
    (SIGTERM: it saves the session), and events keep coming while it is down: their deliveries fail
    and wait under the policy; started again on the same port, every event reaches the
    subscriber, which reconnected by itself. Duplicates only where QoS 1 allows them."""
    name = "fault"
    await broker_mqtt.prepare(broker.url, name)
    consumer = asyncio.create_task(broker_mqtt.consume(broker.url, name, 30, 30.0))
    settings = mqtt_settings(
        database_url, broker.url, f"{name}/{{kind}}/{{source}}", redis_url=REDIS_URL
    )
    runtime = await start(settings)
    async with serving(runtime) as receiver, worker_on(settings, engine):
        ids = await post_events(receiver, 10)
        await eventually(lambda: all_succeeded(engine, 10))
        broker.pause()  # takes the next publishes (the kernel does), acknowledges none
        ids |= await post_events(receiver, 10)
        await asyncio.sleep(0.3)  # their attempts wait for PUBACKs (1 s timeout)
        stopped_at = time.time()
        await asyncio.to_thread(broker.stop)  # resumed with SIGTERM pending: it reads, exits
        ids |= await post_events(receiver, 10)

        async def retried_while_down() -> bool:
            """Every delivery not done failed twice: its first attempt and a retry."""
            rows = await inspect.list_deliveries(engine, limit=100)
            waiting = [r for r in rows if r["status"] != SUCCEEDED]
            return (
                len(rows) == 30
                and len(waiting) >= 10
                and all(r["attempts"] >= 2 and r["last_error"] for r in waiting)
            )

        await eventually(retried_while_down)
        broker.start()
        await eventually(lambda: all_succeeded(engine, 30))
        received = await asyncio.wait_for(consumer, 30)
        rows = await inspect.list_deliveries(engine, limit=100)

    counts = Counter(webhook_id for webhook_id, _ in received)
    assert set(counts) == ids  # none lost
    duplicated = {i for i, n in counts.items() if n > 1}
    # QoS 1 duplicates: published again by a retry (the first publish reached the broker, its
    # PUBACK did not reach the relay), or sent again to the resumed session (the subscriber's
    # PUBACK did not reach the broker before it stopped)
    retried = {r["event_id"] for r in rows if r["attempts"] > 1}
    sent_before_the_stop = {i for i, arrived in received if arrived < stopped_at + 1}
    print(f"duplicates: {len(received) - len(counts)} of {len(received)}; retried {len(retried)}")
    assert duplicated <= retried | sent_before_the_stop


# --- the bench/chaos kit ------------------------------------------------------------------------


async def test_kit_prepares_publishes_consumes_and_cleans_up(shared_broker: None) -> None:
    name = unique_root()
    table = broker_mqtt.destination(MQTT_URL, name)
    config = parse_destination_config(table)
    assert isinstance(config, MqttDestinationConfig)
    assert (config.format, config.topic, config.qos) == (
        "envelope",
        f"{name}/{{kind}}/{{source}}",
        1,
    )
    messages = [
        (f"id-{n}", b"{}", {"webhook-id": f"id-{n}", "kind": "sms.dlr", "source": "de fault"})
        for n in range(40)
    ]
    await broker_mqtt.prepare(MQTT_URL, name)
    try:
        # published before the consumer runs: kept for the run's session
        early = await broker_mqtt.publish(MQTT_URL, name, messages[:20], 8)
        consumer = asyncio.create_task(broker_mqtt.consume(MQTT_URL, name, 41, 1.0))
        late = await broker_mqtt.publish(MQTT_URL, name, messages[20:], 8)
        sender = MqttDestination("events", config)
        try:
            relayed = await sender.deliver(outbound(event_id="id-relayed"), timeout=5)
        finally:
            await sender.aclose()
        received = await consumer
    finally:
        await broker_mqtt.cleanup(MQTT_URL, name)
    assert len(early) == len(late) == 20 and relayed.ok
    assert all(0 < time.time() - t < 60 for t in early + late)
    assert sorted(i for i, _ in received) == sorted([m[0] for m in messages] + ["id-relayed"])
    assert [t for _, t in received] == sorted(t for _, t in received)
    assert not await asyncio.to_thread(session_present, MQTT_URL, f"consume-{name}")


async def test_kit_consume_stops_after_the_idle_timeout(shared_broker: None) -> None:
    name = unique_root()
    await broker_mqtt.prepare(MQTT_URL, name)
    try:
        began = time.monotonic()
        received = await broker_mqtt.consume(MQTT_URL, name, 5, 0.5)
        took = time.monotonic() - began
    finally:
        await broker_mqtt.cleanup(MQTT_URL, name)
    assert received == [] and 0.5 <= took < 3


def test_kit_start_server_fails_with_the_log_when_the_port_is_taken(tmp_path: Path) -> None:
    with private_broker(tmp_path / "first") as running, pytest.raises(RuntimeError) as failed:
        broker_mqtt.start_server(tmp_path / "second", running.port)
    assert f"mosquitto on port {running.port}: exited" in str(failed.value)
    assert "Address already in use" in str(failed.value)  # the log's tail


def test_kit_exposes_exactly_the_kit() -> None:
    public = {
        name
        for name, value in vars(broker_mqtt).items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == broker_mqtt.__name__
    }
    kit = {"destination", "prepare", "consume", "publish", "cleanup"}
    assert public == kit | {"start_server", "stop_server"}
