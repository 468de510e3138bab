"""Helpers of the NATS JetStream destination's tests (their fixtures wrap these): the machine's
NATS server (127.0.0.1:4222, JetStream on), a stream of each test's own, reading a stream back
with a JetStream consumer, and private ``nats-server`` processes (without JetStream, or with a
password) on free ports."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from tests.conftest import service_missing
from tests.support import free_port, stop_process

NATS_URL = os.environ.get("RELAY_TEST_NATS_URL", "nats://127.0.0.1:4222")
SERVER_START_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 10.0


async def connect(url: str, **options: Any) -> Client:
    """A test's own client (``options`` go to nats-py): a server that is down is an error
    within seconds (nats-py's first connection tries ``max_reconnect_attempts + 1`` times), and
    its errors are not logged."""

    async def quiet(exc: Exception) -> None:
        pass

    async with asyncio.timeout(5):
        return await nats.connect(
            url,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0,
            connect_timeout=2,
            error_cb=quiet,
            **options,
        )


@asynccontextmanager
async def shared_server() -> AsyncIterator[Client]:
    """A client of the machine's NATS server (JetStream on); missing: fails under CI=true,
    skipped otherwise."""
    client: Client | None = None
    try:
        client = await connect(NATS_URL)
        await client.jetstream().account_info()
    except (NatsError, OSError, TimeoutError) as exc:
        if client is not None:
            await client.close()
        service_missing(f"NATS JetStream at {NATS_URL}", exc)
    assert client is not None
    try:
        yield client
    finally:
        await client.close()


async def create_stream(js: JetStreamContext, name: str | None = None) -> str:
    """A fresh stream capturing ``NAME.>`` (a unique name by default); its name."""
    name = name or f"relay-test-{uuid.uuid4().hex[:12]}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"]))
    return name


async def delete_stream(js: JetStreamContext, name: str) -> None:
    with suppress(NotFoundError):
        await js.delete_stream(name)


@asynccontextmanager
async def own_stream(js: JetStreamContext) -> AsyncIterator[str]:
    """A stream of the caller's own, deleted afterwards: its name, which is also its subjects'
    first token."""
    name = await create_stream(js)
    try:
        yield name
    finally:
        await delete_stream(js, name)


async def stream_count(js: JetStreamContext, name: str) -> int:
    """How many messages the stream holds."""
    return int((await js.stream_info(name)).state.messages)


async def read_stream(
    js: JetStreamContext, name: str, count: int, timeout: float = READ_TIMEOUT_S
) -> list[Msg]:
    """Every message of stream ``name`` through an ephemeral pull consumer, each acked, until
    ``count`` came (then a short look for one more) or ``timeout`` passed."""
    subscription = await js.pull_subscribe(f"{name}.>", stream=name)
    messages: list[Msg] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            wait = 0.2 if len(messages) >= count else deadline - time.monotonic()
            try:
                batch = await subscription.fetch(max(count - len(messages), 1), timeout=wait)
            except TimeoutError:
                if len(messages) >= count:
                    break
                continue
            for message in batch:
                await message.ack()
            messages.extend(batch)
    finally:
        await subscription.unsubscribe()
    return messages


def nats_server_binary() -> str:
    """The ``nats-server`` binary; missing: fails under CI=true, skipped otherwise."""
    binary = shutil.which("nats-server") or shutil.which("/usr/sbin/nats-server")
    if binary is None:
        service_missing("nats-server (for a private NATS server)", FileNotFoundError("nats-server"))
    assert binary is not None
    return binary


def start_private_server(workdir: Path, port: int, *options: str) -> subprocess.Popen[bytes]:
    """``nats-server`` with ``options`` on 127.0.0.1:``port``, once it accepts connections."""
    log = workdir / f"nats-{port}.log"
    argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), *options]
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.makefile("rb").readline().startswith(b"INFO "):
                    return process
        except OSError:
            time.sleep(0.05)
    stop_process(process)
    raise RuntimeError(f"nats-server on port {port} did not start:\n{log.read_text()[-2000:]}")


@contextmanager
def private_server(workdir: Path, *options: str, port: int | None = None) -> Iterator[str]:
    """The URL of a private ``nats-server`` with ``options`` (none: core NATS only, without
    JetStream), stopped afterwards."""
    port = port or free_port()
    process = start_private_server(workdir, port, *options)
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        stop_process(process)


def connection_names(monitor_port: int) -> list[str]:
    """The names of the clients connected to the server whose monitoring port is
    ``monitor_port`` (``nats-server -m``)."""
    url = f"http://127.0.0.1:{monitor_port}/connz"
    with urllib.request.urlopen(url, timeout=5) as answer:
        document = json.load(answer)
    return [str(c.get("name", "")) for c in document.get("connections") or []]
