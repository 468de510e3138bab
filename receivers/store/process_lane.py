"""The event writer's lane to a SQLite file: a process of its own that writes the batches.

Each item is handed over as it comes (every :data:`FRAME_ITEMS` items, and at the end of each pass
of the event loop, the items queued by then go in one frame), and the process takes, when it
starts a batch, the oldest of those that have arrived (:mod:`receivers.store.writer_process`).
Its answers settle the callers' futures in arrival order. The event loop spends a few
microseconds per item on this and never waits for a write.

Should the process die, the callers still waiting get :class:`StoreUnavailable` (503: the
platform retries, and an item that was committed after all is then a duplicate), the callbacks
that arrive meanwhile too, and a new process is started after :data:`RESTART_DELAY_SECONDS`."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import receivers
from receivers.store.lane_wire import Answer, FrameReader, Record, frame, record_of
from receivers.store.records import (
    Arrival,
    Clock,
    OnStored,
    Receipt,
    StoredEvent,
    StoreUnavailable,
)
from receivers.store.rows import Item

log = logging.getLogger(__name__)

RESTART_DELAY_SECONDS = 1.0
"""How long after the process died a new one is started."""
EXIT_TIMEOUT_SECONDS = 30.0
"""How long :meth:`ProcessLane.close` waits for the answers still due, and then for the process
to end before killing it."""
SOCKET_BUFFER_BYTES = 1 << 22
FRAME_ITEMS = 8
"""Items are sent once this many wait, else at the end of the event loop's pass: the writer
process starts on them while the loop is still busy with the rest of a burst of callbacks."""


class ProcessLane:
    """Hands items to the writer process of ``database`` and settles their futures; see the
    module docstring. ``on_stored`` gets the newly stored events of each batch."""

    def __init__(self, database: str, *, clock: Clock, on_stored: OnStored) -> None:
        self._database = database
        self._clock = clock
        self._on_stored = on_stored
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._transport: asyncio.Transport | None = None
        self._outbox: list[Record] = []
        self._waiting: deque[tuple[Item, asyncio.Future[Any]]] = deque()
        self._flush_handle: asyncio.Handle | None = None
        self._restart: asyncio.TimerHandle | None = None
        self._drained: asyncio.Event | None = None
        self._closing = False

    async def start(self) -> None:
        """Start the writer process (in the event loop that will use the lane)."""
        self._loop = asyncio.get_running_loop()
        await self._spawn()

    def submit(self, item: Item) -> asyncio.Future[Any]:
        """Hand ``item`` over; the future gets its :class:`Receipt` (None for a rejected body)."""
        if self._transport is None or self._closing or self._loop is None:
            raise StoreUnavailable("the event writer process is not running")
        future = self._loop.create_future()
        self._outbox.append(record_of(item))
        self._waiting.append((item, future))
        if len(self._outbox) >= FRAME_ITEMS:
            self._send()
        elif self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        return future

    async def close(self) -> None:
        """Write what was handed over, then end the process."""
        self._closing = True
        for handle in (self._restart, self._flush_handle):
            if handle is not None:
                handle.cancel()
        self._flush()
        if self._waiting and self._transport is not None:
            self._drained = asyncio.Event()
            try:
                async with asyncio.timeout(EXIT_TIMEOUT_SECONDS):
                    await self._drained.wait()
            except TimeoutError:
                log.error("the event writer process did not answer in time; stopping it")
        if self._transport is not None:
            self._transport.close()  # the process sees the end of its input and exits
        await self._reap()

    @property
    def running(self) -> bool:
        """Whether the writer process is up."""
        return self._transport is not None

    @property
    def available(self) -> bool:
        """Whether items handed over now can be written: the process is up, the lane open."""
        return self.running and not self._closing

    # --- the process ---------------------------------------------------------------------------

    async def _spawn(self) -> None:
        assert self._loop is not None
        ours, theirs = socket.socketpair()
        with theirs:
            for sock in (ours, theirs):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
            self._process = subprocess.Popen(
                [sys.executable, "-m", "receivers.store.writer_process", self._database],
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                env=_child_environment(),
                start_new_session=True,  # a Ctrl+C is the server's to handle, not its own
            )
        try:
            await self._loop.create_unix_connection(lambda: _Answers(self), sock=ours)
        except BaseException:
            ours.close()
            raise

    async def _reap(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            status = await asyncio.to_thread(process.wait, EXIT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            log.error("the event writer process did not end in time; killing it")
            process.kill()
            status = await asyncio.to_thread(process.wait)
        if status != 0 and not self._closing:
            log.warning("the event writer process exited with status %s", status)

    def _connected(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def _lost(self) -> None:
        """The process is gone: fail whoever waits, start another one soon."""
        self._transport = None
        self._outbox.clear()
        failed = 0
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(StoreUnavailable("the event writer process ended"))
                failed += 1
        if self._drained is not None:
            self._drained.set()
        if self._closing or self._loop is None:
            return
        log.error(
            "the event writer process ended unexpectedly (%d callers answered 503); "
            "starting another in %.0f s",
            failed,
            RESTART_DELAY_SECONDS,
        )
        self._restart = self._loop.call_later(RESTART_DELAY_SECONDS, self._start_again)

    def _start_again(self) -> None:
        self._restart = None
        assert self._loop is not None
        task = self._loop.create_task(self._respawn())
        task.add_done_callback(_log_failure)

    async def _respawn(self) -> None:
        await self._reap()
        if not self._closing:
            await self._spawn()

    # --- items out, answers in -----------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_handle = None
        self._send()

    def _send(self) -> None:
        if not self._outbox or self._transport is None:
            return
        records, self._outbox = self._outbox, []
        self._transport.write(frame((self._clock().isoformat(), records)))

    def _answered(self, received_at: str, answers: list[Answer]) -> None:
        at = datetime.fromisoformat(received_at)
        stored: list[StoredEvent] = []
        waiting = self._waiting
        for answer in answers:
            item, future = waiting.popleft()
            if future.done():
                continue
            if answer is None:
                future.set_result(None)
            elif isinstance(answer, str):
                future.set_exception(StoreUnavailable(answer))
            else:
                event_id, duplicate = answer
                if not duplicate:
                    assert isinstance(item, Arrival)
                    stored.append(StoredEvent(event_id, item.source, item.kind, at, item.payload))
                future.set_result(Receipt(event_id, duplicate))
        if stored:
            self._on_stored(stored)
        if not waiting and self._drained is not None:
            self._drained.set()


class _Answers(asyncio.Protocol):
    """The lane's end of the socket."""

    def __init__(self, lane: ProcessLane) -> None:
        self._lane = lane
        self._reader = FrameReader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._lane._connected(cast(asyncio.Transport, transport))  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        for received_at, answers in self._reader.feed(data):
            self._lane._answered(received_at, answers)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lane._lost()


def _child_environment() -> dict[str, str]:
    """This environment, with the directory this package was imported from first on the path
    (so that the process runs this very code, installed or not)."""
    root = str(Path(receivers.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("could not start the event writer process", exc_info=task.exception())
