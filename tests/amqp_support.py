"""What the ``amqp`` destination's tests share: a RabbitMQ virtual host of the test run's own,
a test-side client that declares and reads back with aio-pika, and ``rabbitmqctl``.

The machine's broker (``RELAY_TEST_AMQP_URL``, by default guest/guest at 127.0.0.1:5672) is
shared: everything the tests do happens in vhosts named ``relay-test-<uuid>``, created with the
bench kit's :func:`scripts.broker_amqp.make_vhost` and deleted at the end, so nothing touches
``/``. ``rabbitmqctl`` must work for the user running the tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)
from aiormq.exceptions import AMQPError

from relay.destinations import Outbound, parse_destination_config
from relay.destinations.amqp_config import AmqpDestinationConfig
from scripts import broker_amqp
from tests.conftest import service_missing

AMQP_BASE_URL = os.environ.get("RELAY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
RABBITMQCTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
RELAY_CONNECTION = "callback-relay"
"""How the destination's connections start their ``connection_name``."""


def rabbitmqctl(*args: str) -> str:
    """``rabbitmqctl -q args``'s output; fails the test with its output when it fails."""
    done = subprocess.run(
        [RABBITMQCTL, "-q", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"rabbitmqctl {args}: {done.stderr or done.stdout}"
    return done.stdout


def listing(what: str, vhost: str, *columns: str) -> list[dict[str, Any]]:
    """``rabbitmqctl list_<what> -p vhost columns`` as dicts."""
    return json.loads(
        rabbitmqctl(f"list_{what}", "-p", vhost, *columns, "--formatter", "json") or "[]"
    )


def relay_connections(vhost: str) -> int:
    """How many connections of a relay destination are open on ``vhost``."""
    rows = json.loads(
        rabbitmqctl("list_connections", "vhost", "client_properties", "--formatter", "json") or "[]"
    )
    count = 0
    for row in rows:
        names = [v for k, _, v in row["client_properties"] if k == "connection_name"]
        if row["vhost"] == vhost and names and str(names[0]).startswith(RELAY_CONNECTION):
            count += 1
    return count


def vhost_url(vhost: str, *, password: str | None = None, port: int | None = None) -> str:
    """The URL of ``vhost`` on the test broker, with another password or port if given."""
    parts = urlsplit(AMQP_BASE_URL)
    user = parts.username or "guest"
    secret = (parts.password or "guest") if password is None else password
    host = f"{parts.hostname}:{port or parts.port or 5672}"
    return urlunsplit((parts.scheme, f"{user}:{secret}@{host}", f"/{vhost}", "", ""))


def new_vhost() -> tuple[str, str]:
    """A fresh vhost ``relay-test-<uuid>`` (guest may do anything there): (name, URL).
    No ``rabbitmqctl`` or no broker: fails under CI=true, skips otherwise."""
    name = f"relay-test-{uuid.uuid4().hex[:12]}"
    try:
        return name, broker_amqp.make_vhost(name, base_url=AMQP_BASE_URL)
    except (RuntimeError, OSError) as exc:
        service_missing("RabbitMQ (rabbitmqctl add_vhost)", exc)
        raise  # not reached: service_missing fails or skips


async def check_reachable(url: str) -> None:
    """Connect to ``url``; fails (CI) or skips the test when the broker does not answer."""
    try:
        connection = await aio_pika.connect(url, timeout=5)
    except (OSError, AMQPError, TimeoutError) as exc:
        await asyncio.to_thread(broker_amqp.drop_vhost, url)
        service_missing(f"RabbitMQ at {AMQP_BASE_URL.rpartition('@')[2]}", exc)
    else:
        await connection.close()


@contextmanager
def vhost_of_the_run() -> Iterator[tuple[str, str]]:
    """A vhost for the test run: (name, URL); deleted with everything in it after."""
    name, url = new_vhost()
    asyncio.run(check_reachable(url))
    try:
        yield name, url
    finally:
        broker_amqp.drop_vhost(url)


@asynccontextmanager
async def vhost_of_the_test() -> AsyncIterator[tuple[str, str]]:
    """A vhost for one test (its faults touch nothing else): (name, URL); deleted after."""
    name, url = await asyncio.to_thread(new_vhost)
    await check_reachable(url)
    try:
        yield name, url
    finally:
        await asyncio.to_thread(broker_amqp.drop_vhost, url)


class Rabbit:
    """The test side: declares exchanges and queues (deleted at the end) and reads messages
    back with aio-pika, acking them."""

    def __init__(self, vhost: str, url: str, channel: AbstractChannel) -> None:
        self.vhost = vhost
        self.url = url
        self.channel = channel
        self.prefix = f"t-{uuid.uuid4().hex[:10]}"
        self._exchanges: list[str] = []
        self._queues: list[str] = []

    def name(self, what: str) -> str:
        """A name of this test's own."""
        return f"{self.prefix}-{what}"

    async def exchange(self, name: str, kind: str = "topic") -> AbstractExchange:
        self._exchanges.append(name)
        return await self.channel.declare_exchange(name, kind, durable=True)

    async def queue(
        self,
        name: str,
        exchange: str | None = None,
        binding_key: str = "#",
        arguments: dict[str, Any] | None = None,
    ) -> AbstractQueue:
        self._queues.append(name)
        queue = await self.channel.declare_queue(name, durable=True, arguments=arguments)
        if exchange is not None:
            await queue.bind(exchange, binding_key)
        return queue

    def expect(self, *, exchanges: tuple[str, ...] = (), queues: tuple[str, ...] = ()) -> None:
        """Delete these (made by the destination) at the end too."""
        self._exchanges.extend(exchanges)
        self._queues.extend(queues)

    async def messages(
        self, queue: str, count: int, timeout: float = 10.0
    ) -> list[AbstractIncomingMessage]:
        """``count`` messages of ``queue`` (acked), then checks that no other one is there."""
        handle = await self.channel.get_queue(queue, ensure=False)
        got: list[AbstractIncomingMessage] = []
        deadline = asyncio.get_running_loop().time() + timeout
        while len(got) < count:
            message = await handle.get(no_ack=False, fail=False)
            if message is None:
                assert asyncio.get_running_loop().time() < deadline, (
                    f"{len(got)} of {count} messages in {queue} after {timeout} s"
                )
                await asyncio.sleep(0.02)
                continue
            await message.ack()
            got.append(message)
        extra = await handle.get(no_ack=False, fail=False)
        assert extra is None, f"an unexpected message in {queue}: {extra.body[:200]!r}"
        return got

    async def cleanup(self) -> None:
        """Delete what the test declared, on a connection of its own (a test may have had the
        broker close the others)."""
        async with await aio_pika.connect(self.url, timeout=5) as connection:
            channel = await connection.channel()
            for queue in self._queues:
                await channel.queue_delete(queue)
            for exchange in self._exchanges:
                await channel.exchange_delete(exchange)


@asynccontextmanager
async def rabbit_on(vhost: str, url: str) -> AsyncIterator[Rabbit]:
    """A test-side client on ``vhost``; what the test declared is deleted after it."""
    connection: AbstractConnection = await aio_pika.connect(url, timeout=5)
    try:
        channel = await connection.channel()
        helper = Rabbit(vhost, url, channel)
        yield helper
    finally:
        with suppress(Exception):  # the broker may have closed it already
            await connection.close()
    await helper.cleanup()


def amqp_config(url: str, **fields: Any) -> AmqpDestinationConfig:
    """An ``amqp`` destination's settings, validated as a configuration file's would be."""
    config = parse_destination_config({"type": "amqp", "url": url, **fields})
    assert isinstance(config, AmqpDestinationConfig)
    return config


def outbound(
    number: int = 1,
    *,
    kind: str = "conversations.status",
    source: str = "default",
    payload: dict[str, Any] | None = None,
    raw_body: bytes = b'{"event":"MessageStatus::DELIVERED"}',
    content_type: str | None = "application/json",
    method: str = "POST",
) -> Outbound:
    """An event to deliver, with a unique id per call."""
    return Outbound(
        event_id=f"{uuid.uuid4()}-{number}",
        kind=kind,
        source=source,
        received_at=datetime(2026, 11, 24, 12, 0, number % 60, tzinfo=UTC),
        payload={"messageId": f"m-{number}", "event": "MessageStatus::DELIVERED"}
        if payload is None
        else payload,
        raw_body=raw_body,
        content_type=content_type,
        method=method,
    )
