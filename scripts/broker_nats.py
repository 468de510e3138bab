"""The NATS JetStream kit of the relay's benchmark and chaos run (``--destination nats``).

A run named NAME has a stream NAME (file storage) capturing ``NAME.>``; the relay's
destination publishes each event to ``NAME.{kind}.{source}`` through JetStream, waiting for
the stream's ack, with ``Nats-Msg-Id`` = the event id (as
``relay/destinations/nats_jetstream.py`` does). The baseline publishes the same way. The
consumer is a durable push consumer of the stream (deliver all, explicit acks), so it can
start before or after the publishers and survives a server restart (chaos): nats-py
reconnects and the consumer, kept in the stream's store, goes on where it was (a message whose
ack was lost comes again, and counts once: what is measured is what the stream holds).

Fault controls for the chaos run: :func:`start_server` (``nats-server -js`` on a port, its
store in a work directory) and :func:`stop_server` (SIGTERM). Only the standard library and
nats-py are imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

SERVER_BINARY = "nats-server"
FALLBACK_BINARY = "/usr/sbin/nats-server"
SERVER_START_TIMEOUT_S = 15.0
SERVER_STOP_TIMEOUT_S = 15.0
CONNECT_TIMEOUT_S = 5.0
PUBLISH_TIMEOUT_S = 10.0
"""How long the baseline waits for one publish's ack."""
RECONNECT_WAIT_S = 1
"""The consumer's pause between two reconnection attempts to a server that is down."""
ACK_WAIT_S = 5.0
"""A message delivered to the consumer whose ack was lost comes again after this."""
MAX_ACK_PENDING = 65_536
MSG_ID_HEADER = "Nats-Msg-Id"


def _subjects(name: str) -> str:
    """What the stream of ``name`` captures."""
    return f"{name}.>"


def _consumer_name(name: str) -> str:
    """The durable consumer :func:`consume` reads ``name``'s stream with."""
    return f"{name}-reader"


def destination(url: str, name: str) -> dict[str, Any]:
    """The [destinations.NAME] table (as a dict) of a relay destination publishing to the place
    `name` (a unique run name, [a-z0-9-]) on the broker at `url`, format envelope."""
    return {
        "type": "nats",
        "url": url,
        "subject": f"{name}.{{kind}}.{{source}}",
        "format": "envelope",
    }


async def prepare(url: str, name: str) -> None:
    """Create what must exist to publish and consume `name`'s messages (queue/stream/...), empty:
    the stream ``name`` capturing ``name.>`` (a former one of that name is deleted first)."""
    client = await _connect(url)
    try:
        js = client.jetstream()
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
        await js.add_stream(
            StreamConfig(name=name, subjects=[_subjects(name)], storage=StorageType.FILE)
        )
    finally:
        await client.close()


async def consume(url: str, name: str, count: int, timeout: float) -> list[tuple[str, float]]:
    """Read `name`'s messages with the broker's own client, acking each, until `count` distinct
    webhook-id headers were seen or `timeout` seconds passed without a new one; returns every
    message of the stream received as (webhook-id, time.time() at arrival), duplicates included,
    in order.

    A stream message counts once, at its first arrival: one the server sends again because its
    ack was lost (a server restart) is the consumer's repeat, not a second publish by the relay.
    A duplicate here is a second stream message with the same webhook-id."""
    received: list[tuple[str, float]] = []
    seen: set[str] = set()
    sequences: set[int] = set()
    news = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        arrived = time.time()
        webhook_id = (msg.headers or {}).get("webhook-id", "")
        sequence = msg.metadata.sequence.stream
        if sequence not in sequences:
            sequences.add(sequence)
            received.append((webhook_id, arrived))
        if webhook_id not in seen:
            seen.add(webhook_id)
            news.set()
        with contextlib.suppress(NatsError):
            await msg.ack()

    client = await _connect(url, reconnect=True)
    try:
        js = client.jetstream()
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT_S,
            max_ack_pending=MAX_ACK_PENDING,
        )
        subscription = await js.subscribe(
            _subjects(name),
            cb=on_message,
            durable=_consumer_name(name),
            stream=name,
            config=config,
            manual_ack=True,
        )
        while len(seen) < count:
            news.clear()
            try:
                await asyncio.wait_for(news.wait(), timeout)
            except TimeoutError:
                break
        with contextlib.suppress(NatsError):
            await subscription.unsubscribe()
    finally:
        await client.close()
    return received


async def publish(
    url: str, name: str, messages: Sequence[tuple[str, bytes, dict[str, str]]], concurrency: int
) -> list[float]:
    """The broker's own client publishing (webhook-id, body, headers) messages to the same place
    with the SAME confirmation mode as the relay's destination (the baseline of the benchmark),
    `concurrency` publishes awaiting their confirmation at once; returns time.time() of each
    confirmation. A publish that fails is reported on stderr and has no confirmation time."""
    client = await _connect(url)
    confirmed: list[float] = []
    failures: list[str] = []
    queue = iter(messages)
    try:
        js = client.jetstream()

        async def publisher() -> None:
            for webhook_id, body, headers in queue:
                kind = headers.get("kind", "none")
                source = headers.get("source", "none")
                try:
                    await js.publish(
                        f"{name}.{kind}.{source}",
                        body,
                        timeout=PUBLISH_TIMEOUT_S,
                        headers={**headers, MSG_ID_HEADER: webhook_id},
                    )
                except (NatsError, OSError) as exc:
                    failures.append(f"{webhook_id}: {exc}")
                else:
                    confirmed.append(time.time())

        await asyncio.gather(*(publisher() for _ in range(max(1, concurrency))))
    finally:
        await client.close()
    if failures:
        print(
            f"broker_nats: {len(failures)} publishes failed, first: {failures[0]}", file=sys.stderr
        )
    return confirmed


async def cleanup(url: str, name: str) -> None:
    """Delete what prepare created (the stream, and the consumer with it)."""
    client = await _connect(url)
    try:
        with contextlib.suppress(NotFoundError):
            await client.jetstream().delete_stream(name)
    finally:
        await client.close()


def start_server(workdir: Path, port: int) -> subprocess.Popen[bytes]:
    """``nats-server -js`` on 127.0.0.1:``port``, its JetStream store in
    ``workdir/nats-PORT`` (the same directory again for the same port: a restart keeps the
    streams); its log goes to ``workdir/nats-PORT.log``. Returns once it accepts connections
    with JetStream on; RuntimeError if it does not within :data:`SERVER_START_TIMEOUT_S`."""
    binary = shutil.which(SERVER_BINARY) or shutil.which(FALLBACK_BINARY)
    if binary is None:
        raise FileNotFoundError(f"{SERVER_BINARY} is not installed")
    store = workdir / f"nats-{port}"
    store.mkdir(parents=True, exist_ok=True)
    log = workdir / f"nats-{port}.log"
    argv = [binary, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)]
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        if _answers_with_jetstream(port):
            return process
        time.sleep(0.05)
    state = f"exited with {process.returncode}" if process.poll() is not None else "no answer"
    stop_server(process)
    tail = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"nats-server on port {port}: {state}\n{tail}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (nats-server shuts down cleanly, its store kept), then SIGKILL if it has not
    exited within :data:`SERVER_STOP_TIMEOUT_S`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers_with_jetstream(port: int) -> bool:
    """Whether the server on ``port`` accepts a connection and greets it with an INFO line
    saying JetStream is on."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            greeting = sock.makefile("rb").readline(65_536)
    except OSError:
        return False
    return greeting.startswith(b"INFO ") and b'"jetstream":true' in greeting


async def _connect(url: str, *, reconnect: bool = False) -> Client:
    """A connection to ``url`` (a server that is down is an error within
    :data:`CONNECT_TIMEOUT_S`); with ``reconnect``, once connected it reconnects for as long as
    it takes (the chaos run restarts the server under the consumer). Errors are not logged by
    nats-py (its default error callback prints a traceback for each)."""

    async def quiet(exc: Exception) -> None:
        pass

    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        return await nats.connect(
            url,
            connect_timeout=int(CONNECT_TIMEOUT_S),
            allow_reconnect=reconnect,
            # nats-py's first connection tries max_reconnect_attempts + 1 times (0: forever)
            max_reconnect_attempts=-1 if reconnect else 1,
            reconnect_time_wait=RECONNECT_WAIT_S if reconnect else 0,
            error_cb=quiet,
        )
