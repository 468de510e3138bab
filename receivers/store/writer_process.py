"""The writer process: the event writer's lane to a SQLite file is a process of its own.

What it buys: the server's event loop is busy with requests nearly all the time, and a writer in
it (or a thread of it, which needs the GIL to start each batch and again after each call into
SQLite) waits for the loop to go idle, so that writing and serving take turns instead of
overlapping. Here the loop spends a few microseconds per callback handing it over and never
waits for a write: +9 % events/s and p50 latency down by about 1 ms against a writer thread in
the same runs of ``scripts/bench_ingest.py`` (docs/performance.md).
To turn it off, set ``writer_process = false``: the writer then writes on the engine in the
server's own process, as it does for PostgreSQL.

How: :class:`ProcessLane` starts ``python -m receivers.store.writer_process DATABASE LOOP``
(LOOP: the server's kind of event loop, see :mod:`receivers.event_loop`) with its end of a
socket pair as standard input. Each item is handed over as it comes (every
:data:`FRAME_ITEMS` items, and at the end of each pass of the event loop, the items queued by
then go in one frame). The process (:func:`serve`) groups what arrives with a
:class:`~receivers.store.coalescer.Coalescer` (each group takes what has arrived by the time its
write starts) and writes each group with :func:`~receivers.store.batches.write_items`, the
store's one write path, with the in-commit writer the server gave it (see the wire, below);
its answers settle the callers' futures in arrival order, and WAL checkpoints run beside it
(:mod:`receivers.store.wal_checkpoints`).

Should the process die, the callers still waiting get :class:`StoreUnavailable` (503: the
platform retries, and an item that was committed after all is then a duplicate), the callbacks
that arrive meanwhile too, and a new process is started after :data:`RESTART_DELAY_SECONDS`.

The wire: each message is a frame, its length (4 bytes, little-endian) then a value in
:mod:`marshal`'s format (both ends are this same interpreter). Server -> process: first, when
the server has one, ``("in-commit", json)``, the in-commit writer to load (on the socket, not the
command line: a long list of destinations would pass the system's limit on an argument); then
``(sent_at, records)``, the server's clock when it sent them and the items as tuples
(:func:`record_of`); process -> server: ``("log", [level, logger, text, traceback])`` for
each of its log records (:class:`ToServer`: the server logs them as its own), and
``(received_at, answers)`` for the oldest items not
answered yet, in order: per item ``(event id, duplicate, written with)`` (the last: what the
in-commit writer answered, see :mod:`receivers.store.in_commit`), ``None`` for a quarantined
body, or
``[kind, reason]`` (a list) when it could not be stored: ``"full"`` or ``"unreachable"`` when the
store refuses writes (:class:`StoreFull`, :class:`StoreUnreachable`, which the server's
:class:`~receivers.store.writable.StoreWritable` notes and logs once), else ``"unavailable"``.
The process logs no refusal itself.
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import os
import signal
import socket
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import Connection

import receivers
from receivers.event_loop import LoopName, loop_factory, loop_name
from receivers.store.batches import stored_events, write_items
from receivers.store.coalescer import AdaptiveGroupSize, Coalescer
from receivers.store.engine import CONNECT_TIMEOUT_SECONDS, json_text, sqlite_pragmas
from receivers.store.in_commit import InCommit, InCommitWriter
from receivers.store.records import (
    Arrival,
    Clock,
    Item,
    OnStored,
    Receipt,
    Rejection,
    StoreFull,
    StoreUnavailable,
    StoreUnreachable,
)
from receivers.store.wal_checkpoints import BACKSTOP_PAGES, WalCheckpointer
from receivers.store.writable import StoreWritable

log = logging.getLogger(__name__)

HEADER = struct.Struct("<I")
IN_COMMIT = "in-commit"
"""The first frame's tag when it carries the in-commit writer."""
LOG = "log"
"""The tag of a frame that carries one of the process's log records to the server."""
EVENT, REJECTION = 0, 1

Record = tuple[Any, ...]
WireAnswer = tuple[str, bool, Any] | None | list[str]
"""An item's answer on the wire: its receipt, None, or ``[kind, reason]`` of its failure."""
FAILURES: dict[str, type[StoreUnavailable]] = {
    "full": StoreFull,
    "unreachable": StoreUnreachable,
    "unavailable": StoreUnavailable,
}
"""The kinds of failure on the wire."""


def frame(value: Any) -> bytes:
    """``value`` as one frame."""
    body = marshal.dumps(value)
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Cuts the frames out of a byte stream, however it was split."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Take ``data``; the value of every frame it completes."""
        buffer = self._buffer
        buffer += data
        values = []
        start = 0
        with memoryview(buffer) as view:
            while len(buffer) - start >= HEADER.size:
                (size,) = HEADER.unpack_from(view, start)
                end = start + HEADER.size + size
                if end > len(buffer):
                    break
                values.append(marshal.loads(view[start + HEADER.size : end]))
                start = end
        del buffer[:start]
        return values

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buffer)


def record_of(item: Item) -> Record:
    """An item as a tuple of plain values."""
    if isinstance(item, Arrival):
        return (
            EVENT,
            item.source,
            item.kind,
            item.dedup_key,
            item.payload,
            item.raw_body,
            item.content_type,
            item.method,
            item.remote_addr,
            item.platform_id,
            item.event_name,
        )
    return (
        REJECTION,
        item.source,
        item.path,
        item.kind,
        item.status,
        item.reason,
        item.errors,
        item.raw_body,
        item.content_type,
        item.remote_addr,
    )


def item_of(record: Record) -> Item:
    """The item a record was made of."""
    if record[0] == EVENT:
        return Arrival(*record[1:])
    return Rejection(*record[1:])


RESTART_DELAY_SECONDS = 1.0
"""How long after the process died a new one is started."""
EXIT_TIMEOUT_SECONDS = 30.0
"""How long :meth:`ProcessLane.close` waits for the answers still due, and then for the process
to end before killing it."""
CHILD_LOOPS = ("asyncio", "uvloop")
"""The loops the process takes: its server's kind (:func:`~receivers.event_loop.loop_name`)."""
SOCKET_BUFFER_BYTES = 1 << 22
FRAME_ITEMS = 8
"""Items are sent once this many wait, else at the end of the event loop's pass: the writer
process starts on them while the loop is still busy with the rest of a burst of callbacks."""


class ProcessLane:
    """Hands items to the writer process of ``database`` and settles their futures; see the
    module docstring. ``on_stored`` gets the newly stored events of each batch; ``writable``
    is told how each batch went."""

    def __init__(
        self,
        database: str,
        *,
        clock: Clock,
        on_stored: OnStored,
        writable: StoreWritable | None = None,
        in_commit: InCommitWriter | None = None,
    ) -> None:
        self._database = database
        self._in_commit = in_commit
        self._clock = clock
        self._on_stored = on_stored
        self._writable = writable if writable is not None else StoreWritable()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._transport: asyncio.Transport | None = None
        self._outbox: list[Record] = []
        self._waiting: deque[tuple[Item, asyncio.Future[Any]]] = deque()
        self._flush_handle: asyncio.Handle | None = None
        self._restart: asyncio.TimerHandle | None = None
        self._respawning: asyncio.Task[None] | None = None
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
                [
                    sys.executable,
                    "-m",
                    "receivers.store.writer_process",
                    self._database,
                    loop_name(self._loop),  # the server's kind of loop
                ],
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
        """The process is there: its first frame, before any item, is the in-commit writer."""
        self._transport = transport
        if self._in_commit is not None:
            transport.write(frame((IN_COMMIT, self._in_commit.to_json())))

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
        self._respawning = self._loop.create_task(self._respawn())

    async def _respawn(self) -> None:
        """Start a new process; should that fail, try again after the restart delay."""
        try:
            await self._reap()
            if not self._closing:
                await self._spawn()
        except Exception:
            log.exception(
                "could not start the event writer process; trying again in %.0f s",
                RESTART_DELAY_SECONDS,
            )
            if not self._closing and self._loop is not None:
                self._restart = self._loop.call_later(RESTART_DELAY_SECONDS, self._start_again)

    # --- items out, answers in -----------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_handle = None
        self._send()

    def _send(self) -> None:
        if not self._outbox or self._transport is None:
            return
        records, self._outbox = self._outbox, []
        sent_at = self._clock().isoformat()
        try:
            data = frame((sent_at, records))
        except ValueError:  # a value marshal cannot write: that item alone fails
            data = frame((sent_at, self._sendable(records)))
        self._transport.write(data)

    def _sendable(self, records: list[Record]) -> list[Record]:
        """The records marshal can write; the callers of the others (the newest waiting, in
        the same order) fail with :class:`StoreUnavailable`."""
        first = len(self._waiting) - len(records)
        sendable, unsendable = [], []
        for offset, record in enumerate(records):
            try:
                marshal.dumps(record)
            except ValueError:
                unsendable.append(first + offset)
            else:
                sendable.append(record)
        for index in reversed(unsendable):
            _, future = self._waiting[index]
            del self._waiting[index]
            if not future.done():
                future.set_exception(StoreUnavailable("an item the writer process cannot take"))
        return sendable

    def _answered(self, received_at: str, answers: list[WireAnswer]) -> None:
        """Settle the oldest waiting callers; the newly stored events go to ``on_stored``, also
        those whose caller has gone meanwhile."""
        items: list[Item] = []
        settled: list[Receipt | StoreUnavailable | None] = []
        for answer in answers:
            item, future = self._waiting.popleft()
            outcome = _unwire(answer)
            items.append(item)
            settled.append(outcome)
            if future.done():
                continue
            if isinstance(outcome, StoreUnavailable):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._writable.wrote(settled)
        stored = stored_events(items, settled, datetime.fromisoformat(received_at))
        if stored:
            self._on_stored(stored)
        if not self._waiting and self._drained is not None:
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
            if received_at == LOG:
                log_here(*answers)
            else:
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


# --- the process -------------------------------------------------------------------------------


class WriterConnection:
    """The process's one connection to the database (a failed write opens a new one). Each
    write blocks the process's loop meanwhile: its input waits in the socket."""

    def __init__(self, database: str) -> None:
        self._engine = sqlalchemy.create_engine(
            sqlalchemy.URL.create("sqlite", database=database),  # the path as given, not re-parsed
            json_serializer=json_text,
            connect_args={"timeout": CONNECT_TIMEOUT_SECONDS},
            hide_parameters=True,  # as create_engine: no event's data in an error's text
        )
        event.listen(self._engine, "connect", _writer_pragmas)
        event.listen(self._engine, "begin", _begin)
        self._connection: Connection | None = None

    async def transaction(self, function: Callable[[Connection], Any]) -> Any:
        """A :data:`~receivers.store.batches.Transaction`."""
        connection = self._connected()
        try:
            with connection.begin():
                return function(connection)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def dispose(self) -> None:
        self.close()
        self._engine.dispose()

    def _connected(self) -> Connection:
        if self._connection is None:
            self._connection = self._engine.connect()
        return self._connection


async def serve(database: str, sock: socket.socket) -> None:
    """Write what comes over ``sock`` into ``database`` until the socket is closed, with what
    the in-commit writer of its first frame (if it is one) writes for the new events."""
    store = WriterConnection(database)
    also: InCommit | None = None
    checkpoints = WalCheckpointer(database)
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    transport: asyncio.Transport | None = None

    async def write(group: list[tuple[Item, datetime]]) -> list[None]:
        now = max(sent for _, sent in group)
        items = [item for item, _ in group]
        try:
            written = await write_items(store.transaction, items, now, in_commit=also)
        except Exception as exc:  # every item still gets its answer, in its place
            log.exception("could not write a group")
            written = [StoreUnavailable(type(exc).__name__)] * len(group)
        answers = [_wire(answer) for answer in written]
        if not all(isinstance(answer, StoreUnavailable) for answer in written):
            checkpoints.committed()
        if transport is not None and not transport.is_closing():
            transport.write(frame((now.isoformat(), answers)))
        await asyncio.sleep(0)  # the write blocked the loop: read what arrived meanwhile, so
        return [None] * len(group)  # that the next group takes it

    group = Coalescer(write, size=AdaptiveGroupSize())

    class Items(asyncio.Protocol):
        def __init__(self) -> None:
            self._reader = FrameReader()

        def data_received(self, data: bytes) -> None:
            nonlocal also
            for sent_at, records in self._reader.feed(data):
                if sent_at == IN_COMMIT:
                    also = InCommitWriter.from_json(records).load()
                    continue
                sent = datetime.fromisoformat(sent_at)
                for record in records:
                    group.put((item_of(record), sent))

        def connection_lost(self, exc: Exception | None) -> None:
            if not closed.done():
                closed.set_result(None)

    try:
        transport, _ = await loop.connect_accepted_socket(Items, sock)
        logging.getLogger().addHandler(ToServer(transport))
        await closed
        await group.drain()
    finally:
        store.dispose()
        checkpoints.close()


class ToServer(logging.Handler):
    """The process's log records, sent to the server as ``("log", [level, logger, text,
    traceback])`` frames, which it logs through its own handlers (its format, JSON or text, and
    its masking of secrets; :func:`log_here`). Records when the server is gone go to standard
    error."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self._transport = transport

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        trace = logging.Formatter().formatException(record.exc_info) if record.exc_info else None
        if self._transport.is_closing():
            sys.stderr.write(f"{record.levelname} {record.name} (event writer process): {text}\n")
            return
        self._transport.write(frame((LOG, [record.levelno, record.name, text, trace])))


def log_here(level: int, name: str, text: str, trace: str | None) -> None:
    """Log a record of the writer process in this one, its traceback as the record's
    ``exc_text`` (what formatters print of an exception)."""
    logger = logging.getLogger(name)
    if logger.isEnabledFor(level):
        record = logger.makeRecord(name, level, "(event writer process)", 0, "%s", (text,), None)
        record.exc_text = trace
        logger.handle(record)


def _unwire(answer: WireAnswer) -> Receipt | StoreUnavailable | None:
    if isinstance(answer, list):
        kind, reason = answer
        return FAILURES.get(kind, StoreUnavailable)(reason)
    return None if answer is None else Receipt(*answer)


def _wire(answer: Receipt | StoreUnavailable | None) -> WireAnswer:
    if isinstance(answer, Receipt):
        return (answer.event_id, answer.duplicate, answer.written_with)
    if answer is None:
        return None
    kind = next(name for name, failure in FAILURES.items() if isinstance(answer, failure))
    return [kind, str(answer)]


def _writer_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """The store's pragmas, the writer's own checkpoint threshold (see
    :mod:`receivers.store.wal_checkpoints`), and the driver in autocommit mode, so that
    SQLAlchemy's transactions begin with an explicit :func:`_begin` (the recipe of SQLAlchemy's
    SQLite dialect documentation: the driver's own would begin them late)."""
    sqlite_pragmas(dbapi_connection)
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
    cursor.close()


def _begin(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN")


def main(argv: Sequence[str]) -> int:
    if len(argv) != 3 or argv[2] not in CHILD_LOOPS:
        print(
            "usage: python -m receivers.store.writer_process DATABASE asyncio|uvloop",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl+C: it closes the socket
    logging.getLogger().setLevel(logging.INFO)  # its records go to the server (ToServer)
    sock = socket.socket(fileno=os.dup(sys.stdin.fileno()))
    try:
        with asyncio.Runner(loop_factory=loop_factory(cast(LoopName, argv[2]))) as runner:
            runner.run(serve(argv[1], sock))
    except (BrokenPipeError, ConnectionResetError):
        return 1  # the server is gone; what was acknowledged is committed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
