"""Services that go away and come back, for the outage tests: a private ``redis-server`` stopped
(SIGTERM or SIGKILL) and started again on the same port, a gate (TCP proxy) in front of the
machine's PostgreSQL that the test closes and opens, and a stand-in PostgreSQL refusing every
login with the error the test chooses."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import struct
from collections.abc import AsyncIterator
from pathlib import Path

from tests.conftest import _start_private_redis
from tests.support import free_port, stop_process

APPEND_ONLY = ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
"""What the operations page advises for the queue's Redis: its data survives a restart (all of
it after SIGTERM, all but the last second's after SIGKILL)."""


class RestartableRedis:
    """A ``redis-server`` of the test's own, with an append-only file in ``workdir``."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self._binary, self._workdir = binary, workdir
        self.process, self.url = _start_private_redis(binary, workdir, options=APPEND_ONLY)
        self.port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        """Stop the server with ``how`` and wait until it has exited."""
        self.process.send_signal(how)
        self.process.wait(timeout=30)

    def start(self) -> None:
        """Start it again on the same port, with the data it kept."""
        self.process, _ = _start_private_redis(
            self._binary, self._workdir, port=self.port, options=APPEND_ONLY
        )

    def close(self) -> None:
        stop_process(self.process)


class Gate:
    """A TCP proxy from a port of 127.0.0.1 to ``target_port``: :meth:`close` cuts every
    connection through it (a reset) and refuses new ones, :meth:`open` lets them through
    again, on the same port. What the clients see of a server that is lost and back; and
    :meth:`cut` alone, of their connections terminated."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._clients: set[asyncio.StreamWriter] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    def cut(self) -> None:
        """Reset every connection through the gate, and let new ones through: what its
        clients see of their connections terminated by the server (callable from sync code,
        such as a SQLAlchemy event)."""
        for writer in list(self._clients):
            writer.transport.abort()

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.cut()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self._target_port
            )
            try:
                await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
            finally:
                upstream_writer.transport.abort()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._pipes.discard(task)
            self._clients.discard(writer)
            writer.transport.abort()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while data := await source.read(65536):
        sink.write(data)
        await sink.drain()
    sink.transport.abort()  # one side ended: so does the other


@contextlib.asynccontextmanager
async def gate_to(target_port: int) -> AsyncIterator[Gate]:
    """An open :class:`Gate` to ``target_port``, closed at the end."""
    gate = Gate(target_port)
    await gate.open()
    try:
        yield gate
    finally:
        await gate.close()


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


@contextlib.asynccontextmanager
async def postgres_refusing_logins(
    sqlstate: str, message: str, *, ask_password: bool = False
) -> AsyncIterator[int]:
    """A port where a stand-in PostgreSQL answers every login with the error ``sqlstate``
    (``message``), after asking for a password if ``ask_password``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack("!i", await reader.readexactly(4))[0]
                startup = await reader.readexactly(size - 4)
                if startup[:4] != struct.pack("!i", 80877103):  # not an SSL request
                    break
                writer.write(b"N")  # no SSL
            if ask_password:
                writer.write(_message(b"R", struct.pack("!i", 3)))  # cleartext password, please
                await reader.readexactly(1)
                size = struct.unpack("!i", await reader.readexactly(4))[0]
                await reader.readexactly(size - 4)  # the password
            fields = [b"SFATAL", b"VFATAL", b"C" + sqlstate.encode(), b"M" + message.encode()]
            writer.write(_message(b"E", b"".join(f + b"\0" for f in fields) + b"\0"))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]
