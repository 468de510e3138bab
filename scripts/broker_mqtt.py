"""The MQTT (Mosquitto) kit of the relay benchmark and of the chaos run.

``scripts/bench_relay.py --destination mqtt`` and ``scripts/chaos.py --destination mqtt`` import
it as ``broker_mqtt``: it names the relay's destination table (topic ``<name>/{kind}/{source}``,
QoS 1, MQTT 5), reads the messages back with paho-mqtt (the client aiomqtt is built on),
publishes the benchmark's baseline with aiomqtt the way the relay's destination does (QoS 1:
each publish waits for its PUBACK, at most 20 in flight), and runs a Mosquitto of
its own for the chaos run (:func:`start_server`, :func:`stop_server`: the machine's shared
broker is never stopped).

MQTT keeps nothing for a subscriber that is not connected, unless it has a session. So
:func:`prepare` opens a persistent session for the run (client id ``consume-<name>``, a
subscription to ``<name>/#`` with QoS 1, a session expiry of an hour) and disconnects: from
then on the broker queues the run's messages for that session, and :func:`consume` resumes it
(clean start off): it receives what was published before it connected, and what was published
while it reconnected (after a restart too: :func:`start_server`'s broker saves its sessions).
:func:`cleanup` ends the session. The limit: Mosquitto queues at most ``max_queued_messages``
per session beyond the 20 in flight (1000 on a default configuration, as the machine's broker;
1 000 000 on :func:`start_server`'s), and drops the rest (its log says "Outgoing messages are
being dropped"). A caller about to publish more than that should let :func:`consume` connect
first (``broker_bench`` gives it ``CONSUMER_READY_SECONDS``); once connected, the consumer
keeps up with the relay and with :func:`publish`.

Only the standard library, aiomqtt and paho-mqtt are imported (not ``benchlib``, not
``relay``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

MOSQUITTO = os.environ.get("MOSQUITTO") or shutil.which("mosquitto") or "/usr/sbin/mosquitto"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
TOPIC = "{name}/{kind}/{source}"
"""The relay destination's topic template, with the run's name; :func:`publish` builds the
same topics from the headers."""
SESSION_EXPIRY_S = 3600
"""How long the broker keeps a run's session after its consumer disconnected."""
RECONNECT_MIN_DELAY_S = 1
RECONNECT_MAX_DELAY_S = 2
CONNECT_TIMEOUT_S = 10.0
SERVER_START_TIMEOUT_S = 10.0
SERVER_STOP_TIMEOUT_S = 10.0
VALUE_LENGTH = 64
UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def destination(url: str, name: str) -> dict[str, Any]:
    """The [destinations.NAME] table (as a dict) of a relay destination publishing to the place
    `name` (a unique run name, [a-z0-9-]) on the broker at `url`, format envelope."""
    _check_name(name)
    return {
        "type": "mqtt",
        "url": url,
        "topic": TOPIC.format(name=name, kind="{kind}", source="{source}"),
        "qos": 1,
        "format": "envelope",
    }


async def prepare(url: str, name: str) -> None:
    """Create what must exist to publish and consume `name`'s messages (queue/stream/...), empty.

    A new persistent session subscribed to ``<name>/#`` (QoS 1): any earlier session of the run
    and the messages it queued are discarded."""
    await cleanup(url, name)
    # clean start off: Mosquitto 2.0 saves across a restart only sessions opened without it
    async with _client(url, _session(name), clean_start=False, expiry=SESSION_EXPIRY_S) as client:
        await client.subscribe(f"{name}/#", qos=1)


async def consume(url: str, name: str, count: int, timeout: float) -> list[tuple[str, float]]:
    """Read `name`'s messages with the broker's own client, acking each, until `count` distinct
    webhook-id headers were seen or `timeout` seconds passed without a new one; returns every
    message received as (webhook-id, time.time() at arrival), duplicates included, in order.

    Resumes the session :func:`prepare` opened (messages published since are waiting there) and
    reconnects to it when the connection drops (QoS 1: each message is acknowledged on arrival,
    so the broker redelivers only what was not). This side runs on paho-mqtt's own network
    thread rather than on aiomqtt's message iterator, which takes more than twice the CPU per
    message: a consumer that falls behind by more than the broker's ``max_queued_messages``
    loses messages."""
    _check_name(name)
    received: list[tuple[str, float]] = []
    seen: set[str] = set()
    loop = asyncio.get_running_loop()
    news = asyncio.Event()

    def on_connect(client: mqtt.Client, *_: object) -> None:
        client.subscribe(f"{name}/#", qos=1)  # the session has it already: harmless

    def on_message(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        webhook_id = _user_properties(message.properties).get("webhook-id", "")
        received.append((webhook_id, time.time()))  # paho acknowledges once this returns
        if webhook_id not in seen:
            seen.add(webhook_id)
            loop.call_soon_threadsafe(news.set)

    client = _paho_client(url, _session(name))
    client.on_connect = on_connect
    client.on_message = on_message
    client.reconnect_delay_set(RECONNECT_MIN_DELAY_S, RECONNECT_MAX_DELAY_S)
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = SESSION_EXPIRY_S
    host, port = _address(url)
    client.connect_async(host, port, clean_start=False, properties=properties)
    client.loop_start()  # connects, and connects again after a drop, in paho's thread
    try:
        while len(seen) < count:
            news.clear()
            try:
                await asyncio.wait_for(news.wait(), timeout)
            except TimeoutError:
                break
    finally:
        client.disconnect()
        await asyncio.to_thread(client.loop_stop)
    return list(received)


async def publish(
    url: str,
    name: str,
    messages: Sequence[tuple[str, bytes, dict[str, str]]],
    concurrency: int,
) -> list[float]:
    """The broker's own client publishing (webhook-id, body, headers) messages to the same place
    with the SAME confirmation mode as the relay's destination (the baseline of the benchmark),
    `concurrency` publishes awaiting their confirmation at once; returns time.time() of each
    confirmation.

    QoS 1, retain off, the headers as user properties but ``content-type``, which is the MQTT 5
    content type (as the relay publishes); at most 20 messages in flight, as the relay."""
    _check_name(name)
    confirmed: list[float] = [0.0] * len(messages)
    pending = iter(enumerate(messages))
    async with _client(url, f"publish-{name}", clean_start=True) as client:
        client.pending_calls_threshold = max(concurrency, 10) + 1  # no warning per publish

        async def publisher() -> None:
            for index, (_, body, headers) in pending:
                topic = TOPIC.format(
                    name=name,
                    kind=headers.get("kind", "none"),
                    source=_safe(headers.get("source")),
                )
                await client.publish(
                    topic, body, qos=1, properties=_properties(headers), timeout=60
                )
                confirmed[index] = time.time()

        await asyncio.gather(*(publisher() for _ in range(max(1, concurrency))))
    return confirmed


async def cleanup(url: str, name: str) -> None:
    """Delete what prepare created: the run's session (and what it still queued)."""
    _check_name(name)
    async with _client(url, _session(name), clean_start=True, expiry=0):
        pass


def start_server(
    workdir: Path, port: int, *, config: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """A Mosquitto of its own on 127.0.0.1:`port` (anonymous, MQTT 5), returned once it accepts
    connections; its configuration, log and persistence file are in `workdir`. Started again
    with the same `workdir` and `port`, it resumes the sessions it saved when stopped.
    `config` lines are added to the configuration (an ``acl_file``, a ``password_file``...).
    ``RuntimeError`` (with the log's tail) when it exits or does not listen in time."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / f"mosquitto-{port}.conf"
    log = workdir / f"mosquitto-{port}.log"
    lines = [
        f"listener {port} 127.0.0.1",
        "allow_anonymous true",
        "persistence true",
        f"persistence_location {workdir}/",
        f"persistence_file mosquitto-{port}.db",
        "max_queued_messages 1000000",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_type information",
        # started by root, Mosquitto would run as "mosquitto", which cannot write in workdir
        f"user {pwd.getpwuid(os.getuid()).pw_name}",
        *config,
    ]
    conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with log.open("ab") as out:
        logged_before = out.tell()
        process = subprocess.Popen(
            [MOSQUITTO, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        # its listener is open once it logs "running" (another process may hold the port)
        if _logged_since(log, logged_before, " running"):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return process
        time.sleep(0.02)
    state = f"exited with {process.returncode}" if process.poll() is not None else "not listening"
    stop_server(process)
    tail = _logged_since(log, logged_before)[-2000:]
    raise RuntimeError(f"mosquitto on port {port}: {state} after start\n{tail}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """Stop a broker of :func:`start_server` (SIGTERM: it saves its sessions) and wait for it;
    killed if it does not stop in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _logged_since(log: Path, offset: int, needle: str = "") -> str:
    """What `log` gained since `offset` ("" when that does not hold `needle`)."""
    with log.open("rb") as text:
        text.seek(offset)
        logged = text.read().decode("utf-8", errors="replace")
    return logged if needle in logged else ""


@contextlib.asynccontextmanager
async def _client(
    url: str, identifier: str, *, clean_start: bool, expiry: int | None = None
) -> AsyncIterator[aiomqtt.Client]:
    """A connected MQTT 5 client; `expiry` sets its session expiry interval."""
    parts = urlsplit(url)
    properties = Properties(PacketTypes.CONNECT)
    if expiry is not None:
        properties.SessionExpiryInterval = expiry
    elif not clean_start:
        properties.SessionExpiryInterval = SESSION_EXPIRY_S
    client = aiomqtt.Client(
        *_address(url),
        username=None if parts.username is None else unquote(parts.username),
        password=None if parts.password is None else unquote(parts.password),
        identifier=identifier,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=clean_start,
        properties=properties,
        timeout=CONNECT_TIMEOUT_S,
        tls_params=aiomqtt.TLSParameters() if parts.scheme == "mqtts" else None,
    )
    async with client:
        yield client


def _session(name: str) -> str:
    """The client id of a run's consumer session."""
    return f"consume-{name}"


def _paho_client(url: str, identifier: str) -> mqtt.Client:
    parts = urlsplit(url)
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=identifier, protocol=mqtt.MQTTv5
    )
    if parts.username is not None:
        password = None if parts.password is None else unquote(parts.password)
        client.username_pw_set(unquote(parts.username), password)
    if parts.scheme == "mqtts":
        client.tls_set_context(ssl.create_default_context())
    return client


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    default = 8883 if parts.scheme == "mqtts" else 1883
    return parts.hostname or "127.0.0.1", default if parts.port is None else parts.port


def _properties(headers: dict[str, str]) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    if "content-type" in headers:
        properties.ContentType = headers["content-type"]
    properties.UserProperty = [(k, v) for k, v in headers.items() if k != "content-type"]
    return properties


def _user_properties(properties: Properties | None) -> dict[str, str]:
    pairs = getattr(properties, "UserProperty", None) or []
    return {str(key): str(value) for key, value in pairs}


def _safe(value: str | None) -> str:
    """A source as the relay's topic template inserts it."""
    return UNSAFE.sub("_", value[:VALUE_LENGTH]) if value else "none"


def _check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a run name ([A-Za-z0-9._-])")
