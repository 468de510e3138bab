"""The RabbitMQ (AMQP) kit of the relay benchmark and of the chaos run.

``scripts/bench_relay.py --destination amqp`` and ``scripts/chaos.py --destination amqp`` import
it as ``broker_amqp``: it names the relay's destination table, prepares and empties what a run
publishes to (a durable topic exchange and a durable queue bound to it with ``#``, both named
after the run), reads the messages back with aio-pika, publishes the benchmark's baseline the
way the relay's destination does (persistent, mandatory, publisher confirms), and breaks and
restores the broker for the chaos run.

Everything a run does happens in a virtual host of its own (:func:`make_vhost`), so that a run
neither sees nor disturbs anything else on a shared broker: the faults (:func:`break_access`,
:func:`restore_access`) clear and restore the user's permissions on that vhost and close its
connections, with ``rabbitmqctl`` (which must work for the user running the script). The
broker-wide controls (``set_vm_memory_high_watermark``, stopping the node) are never used.

Only the standard library and aio-pika are imported (not ``benchlib``, not ``relay``).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError

BASE_URL = os.environ.get("RELAY_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
"""The broker and user of :func:`make_vhost` (its vhost part is ignored)."""
RABBITMQCTL = (
    os.environ.get("RABBITMQCTL") or shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
)
CTL_TIMEOUT_S = 60.0
ROUTING_KEY = "{kind}.{source}"
"""The relay destination's routing key; :func:`publish` builds the same from the headers."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
APP_ID = "callback-relay"
CONNECT_TIMEOUT_S = 5.0
RECONNECT_DELAY_S = 0.2
POLL_S = 0.02
CLIENT_ERRORS = (AMQPError, ChannelInvalidStateError, OSError, RuntimeError)
"""What aio-pika raises when the broker closes or refuses a connection or channel."""


def destination(url: str, name: str) -> dict[str, Any]:
    """The [destinations.NAME] table (as a dict) of a relay destination publishing to the place
    `name` (a unique run name, [a-z0-9-]) on the broker at `url`, format envelope."""
    return {
        "type": "amqp",
        "url": url,
        "exchange": name,
        "routing_key": ROUTING_KEY,
        "format": "envelope",
        # the same declarations as prepare(): redone by the relay on each (re)connection
        "declare": {"exchange_type": "topic", "queue": name, "binding_key": "#"},
    }


async def prepare(url: str, name: str) -> None:
    """Create what must exist to publish and consume `name`'s messages (queue/stream/...), empty."""
    _check_name(name)
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind(exchange, "#")
        await queue.purge()


async def consume(url: str, name: str, count: int, timeout: float) -> list[tuple[str, float]]:
    """Read `name`'s messages with the broker's own client, acking each, until `count` distinct
    webhook-id headers were seen or `timeout` seconds passed without a new one; returns every
    message received as (webhook-id, time.time() at arrival), duplicates included, in order.

    It lasts through :func:`break_access`: when the broker closes its connection it connects
    again (every ``RECONNECT_DELAY_S`` while access is refused). A message counts once its ack
    was sent; one whose ack could not be is delivered again, and counted then."""
    received: list[tuple[str, float]] = []
    seen: set[str] = set()
    idle_until = time.monotonic() + timeout

    async def on_message(message: AbstractIncomingMessage) -> None:
        nonlocal idle_until
        arrived = time.time()
        header = (message.headers or {}).get("webhook-id")
        webhook_id = str(header if header is not None else message.message_id)
        try:
            await message.ack()
        except CLIENT_ERRORS:
            return  # the channel closed: the broker delivers it again
        received.append((webhook_id, arrived))
        if webhook_id not in seen:
            seen.add(webhook_id)
            idle_until = time.monotonic() + timeout

    while len(seen) < count and time.monotonic() < idle_until:
        try:
            async with await aio_pika.connect(url, timeout=CONNECT_TIMEOUT_S) as connection:
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=1000)
                queue = await channel.declare_queue(name, durable=True, passive=True)
                await queue.consume(on_message)
                while len(seen) < count and time.monotonic() < idle_until:
                    if channel.is_closed:
                        break  # closed by the broker: connect again
                    await asyncio.sleep(POLL_S)
        except CLIENT_ERRORS:
            await asyncio.sleep(RECONNECT_DELAY_S)
    return received


async def publish(
    url: str,
    name: str,
    messages: Sequence[tuple[str, bytes, dict[str, str]]],
    concurrency: int,
) -> list[float]:
    """The broker's own client publishing (webhook-id, body, headers) messages to the same place
    with the SAME confirmation mode as the relay's destination (the baseline of the benchmark),
    `concurrency` publishes awaiting their confirmation at once; returns time.time() of each
    confirmation."""
    confirmed: list[float] = [0.0] * len(messages)
    pending = iter(enumerate(messages))

    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(name, ensure=False)

        async def publisher() -> None:
            for index, (webhook_id, body, headers) in pending:
                message = aio_pika.Message(
                    body,
                    headers=dict(headers),
                    content_type=headers.get("content-type"),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=webhook_id,
                    timestamp=int(headers.get("webhook-timestamp") or time.time()),
                    app_id=APP_ID,
                )
                routing_key = ROUTING_KEY.format(
                    kind=headers.get("kind", "none"), source=headers.get("source", "none")
                )
                await exchange.publish(message, routing_key, mandatory=True)
                confirmed[index] = time.time()

        await asyncio.gather(*(publisher() for _ in range(max(1, concurrency))))
    return confirmed


async def cleanup(url: str, name: str) -> None:
    """Delete what prepare created."""
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        await channel.queue_delete(name)
        await channel.exchange_delete(name)


def make_vhost(name: str, *, base_url: str = BASE_URL) -> str:
    """Create the virtual host `name` (the user of `base_url` may do anything in it) on the
    broker of `base_url`; the amqp URL of that vhost for that user."""
    _check_name(name)
    user = _user(base_url)
    _ctl("add_vhost", name)
    _ctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}/{quote(name, safe='')}"


def drop_vhost(url: str) -> None:
    """Delete the virtual host of `url` with everything in it (never the default one, ``/``)."""
    _ctl("delete_vhost", _own_vhost(url))


def break_access(url: str) -> None:
    """Make the vhost of `url` unusable: its user's permissions there are cleared (no new
    connection can open it) and its connections are closed."""
    vhost = _own_vhost(url)
    _ctl("clear_permissions", "-p", vhost, _user(url))
    _ctl("close_all_connections", "-p", vhost, "chaos: access broken")


def restore_access(url: str) -> None:
    """Make the vhost of `url` usable again (every permission for its user)."""
    _ctl("set_permissions", "-p", _own_vhost(url), _user(url), ".*", ".*", ".*")


def _check_name(name: str) -> None:
    if not NAME.fullmatch(name) or name.startswith("amq."):
        raise ValueError(f"{name!r} is not a run name ([A-Za-z0-9._-], not amq.*)")


def _own_vhost(url: str) -> str:
    """The vhost of `url`, refusing the broker's default vhost (shared by everyone)."""
    vhost = unquote(urlsplit(url).path[1:])
    if not vhost or vhost == "/":
        raise ValueError("refusing to touch the default vhost '/': use make_vhost()")
    return vhost


def _user(url: str) -> str:
    return unquote(urlsplit(url).username or "guest")


def _ctl(*args: str) -> str:
    """Run ``rabbitmqctl args``; its output. ``RuntimeError`` with its output when it fails."""
    try:
        done = subprocess.run(
            [RABBITMQCTL, "-q", *args],
            capture_output=True,
            text=True,
            timeout=CTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"rabbitmqctl {args[0]}: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-500:]}"
        )
    return done.stdout
