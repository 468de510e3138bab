"""What the ``mqtt`` destination's tests share: the machine's Mosquitto (``RELAY_TEST_MQTT_URL``,
by default anonymous at 127.0.0.1:1883), private Mosquitto processes on free ports (through the
bench kit's :func:`scripts.broker_mqtt.start_server`: an ACL, a password file, stopped, paused,
killed), and test-side subscribers reading messages back with aiomqtt.

MQTT keeps nothing for a subscriber that is not there: a test subscribes (and gets its SUBACK)
before it delivers. On the shared broker each test uses topics under ``relay-test-<uuid>/``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from scripts import broker_mqtt
from tests.conftest import service_missing
from tests.support import free_port, pause_process

MQTT_URL = os.environ.get("RELAY_TEST_MQTT_URL", "mqtt://127.0.0.1:1883")
READ_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 3.0
START_ATTEMPTS = 3


def unique_root() -> str:
    """A topic root of the caller's own on a shared broker."""
    return f"relay-test-{uuid.uuid4().hex[:12]}"


def mosquitto() -> str:
    """The ``mosquitto`` binary; missing: fails under CI=true, skipped otherwise."""
    binary = shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")
    if binary is None:
        service_missing("mosquitto (for a private broker)", FileNotFoundError("mosquitto"))
    assert binary is not None
    return binary


def mosquitto_passwd() -> str:
    """The ``mosquitto_passwd`` binary; missing: fails under CI=true, skipped otherwise."""
    binary = shutil.which("mosquitto_passwd")
    if binary is None:
        service_missing("mosquitto_passwd", FileNotFoundError("mosquitto_passwd"))
    assert binary is not None
    return binary


def mqtt_client(url: str = MQTT_URL, **options: object) -> aiomqtt.Client:
    """A test-side MQTT 5 client of the broker at ``url`` (``mqtt://host:port``)."""
    host, port = broker_address(url)
    return aiomqtt.Client(
        host,
        port,
        protocol=aiomqtt.ProtocolVersion.V5,
        timeout=CONNECT_TIMEOUT_S,
        **options,  # type: ignore[arg-type]
    )


def broker_address(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("mqtt://").rpartition("@")[2].partition(":")
    return host, int(port or 1883)


async def check_shared_broker() -> None:
    """The machine's broker answers a CONNECT; missing: fails under CI=true, skipped otherwise."""
    try:
        async with mqtt_client():
            pass
    except aiomqtt.MqttError as exc:
        service_missing(f"Mosquitto at {MQTT_URL}", exc)


def user_properties(message: aiomqtt.Message) -> dict[str, str]:
    """A received message's user properties as a dict."""
    return dict(getattr(message.properties, "UserProperty", None) or [])


def content_type(message: aiomqtt.Message) -> str | None:
    return getattr(message.properties, "ContentType", None)


@dataclass
class Subscriber:
    """Messages received on a subscription, in order."""

    messages: list[aiomqtt.Message] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_for(self, count: int, timeout: float = READ_TIMEOUT_S) -> list[aiomqtt.Message]:
        """The first ``count`` messages (then a short look for one more, which fails the test
        where exactly ``count`` are expected); fails when they do not come in ``timeout``."""
        async with asyncio.timeout(timeout):
            while len(self.messages) < count:
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.sleep(0.2)
        return list(self.messages)


@asynccontextmanager
async def subscribed(topic: str, qos: int, url: str = MQTT_URL) -> AsyncIterator[Subscriber]:
    """A subscription to ``topic`` (a filter) with ``qos``, acknowledged by the broker before
    this yields. Retain as published: a retained publish would show ``retain`` set."""
    subscriber = Subscriber()
    async with mqtt_client(url) as reader:
        options = SubscribeOptions(qos=qos, retainAsPublished=True)
        await reader.subscribe(topic, options=options)

        async def read() -> None:
            async for message in reader.messages:
                subscriber.messages.append(message)
                subscriber.arrived.set()

        task = asyncio.create_task(read())
        try:
            yield subscriber
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await task


@dataclass
class PrivateBroker:
    """A Mosquitto of a test's own (the kit's :func:`~scripts.broker_mqtt.start_server`)."""

    workdir: Path
    port: int
    config: Sequence[str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"mosquitto-{self.port}.log"

    def start(self) -> None:
        self.process = broker_mqtt.start_server(self.workdir, self.port, config=self.config)

    def stop(self) -> None:
        """SIGTERM, and wait for the exit (a paused broker is resumed to handle it)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.resume()
            broker_mqtt.stop_server(self.process)
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open (and the kernel still accepts new ones), unanswered."""
        assert self.process is not None
        pause_process(self.process)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL (works on a paused broker too): its connections are closed by the kernel."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def connections(self, client_id_prefix: str) -> int:
        """How many connections of clients whose id starts so the broker accepted so far."""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return text.count(f" as {client_id_prefix}")


@contextmanager
def private_broker(workdir: Path, *config: str) -> Iterator[PrivateBroker]:
    """A started private Mosquitto (anonymous, ``config`` lines added) on a free port, stopped
    afterwards. Another process may take the probed port first: a few ports are tried."""
    mosquitto()
    problems: list[str] = []
    for _ in range(START_ATTEMPTS):
        broker = PrivateBroker(workdir, free_port(), config)
        try:
            broker.start()
        except RuntimeError as exc:
            problems.append(str(exc))
            continue
        try:
            yield broker
        finally:
            broker.stop()
        return
    raise RuntimeError("no private mosquitto started:\n" + "\n".join(problems))


def session_present(url: str, client_id: str) -> bool:
    """Whether the broker holds a session for ``client_id`` (asked without leaving one)."""
    found: list[bool] = []
    paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)

    def on_connect(c: mqtt.Client, u: object, flags: mqtt.ConnectFlags, *_: object) -> None:
        found.append(flags.session_present)

    paho.on_connect = on_connect
    host, port = broker_address(url)
    paho.connect(host, port, clean_start=False)  # no session expiry: none is left behind
    try:
        for _ in range(100):
            paho.loop(0.05)
            if found:
                break
    finally:
        paho.disconnect()
    assert found, "no CONNACK"
    return found[0]
