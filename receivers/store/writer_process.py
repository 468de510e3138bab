"""The event writer's own process: writes the callbacks of a SQLite store, batch after batch.

Started by :class:`~receivers.store.process_lane.ProcessLane` as
``python -m receivers.store.writer_process DATABASE``, with its end of a socket pair as standard
input. It reads items as they come (:mod:`receivers.store.lane_wire`), and each batch takes the
oldest of the items that have arrived by the time its write starts, as many as its
:class:`~receivers.store.batch_limit.BatchLimit` allows: one transaction, one commit
(``synchronous=FULL``), then the answers go back. It ends, once the items sent are
written, when the socket is closed (the writer stopping, or its process gone).

Why a process: the server's event loop is busy with requests nearly all the time, and a writer
thread inside it needs the GIL to start each batch and again after each call into SQLite. Each
time it waited for the loop to go idle (measured: about 70 % of every batch's time), so that
writing and serving took turns instead of overlapping. Here, nothing waits for the GIL.

Standard library and pydantic-core only, so that it starts in a fraction of a second."""

from __future__ import annotations

import logging
import signal
import socket
import sqlite3
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime

from receivers.store.batch_limit import BatchLimit
from receivers.store.lane_wire import Answer, FrameReader, Record, frame, item_of
from receivers.store.rows import Item, batch_rows, receipts
from receivers.store.sqlite_batches import SqliteBatchWriter

log = logging.getLogger(__name__)

READ_BYTES = 1 << 20
CONNECTION_ERRORS = (sqlite3.OperationalError, OSError)
"""Errors that fail a whole batch (the database is unavailable); any other makes the writer
try the batch's items one by one, so that only the item at fault fails."""


class Inbox:
    """The items read from the socket and not yet written, with the time each was sent."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = FrameReader()
        self._items: deque[tuple[datetime, Record]] = deque()
        self.closed = False

    def take(self, limit: BatchLimit) -> tuple[datetime | None, list[Item]]:
        """Wait for items; then the oldest of everything that has arrived by now, as many as
        ``limit`` allows, and when the newest of them was sent. No items: the socket was
        closed."""
        self._receive(block=False)
        idle = not self._items
        if idle:
            while not self._items and not self.closed:
                self._receive(block=True)
            self._receive(block=False)
        count = limit.take(len(self._items), idle=idle)
        taken = [self._items.popleft() for _ in range(count)]
        sent_at = max((sent for sent, _ in taken), default=None)
        return sent_at, [item_of(record) for _, record in taken]

    def _receive(self, *, block: bool) -> None:
        while not self.closed:
            try:
                data = self._sock.recv(READ_BYTES, 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not data:
                self.closed = True
                return
            for sent_at, records in self._reader.feed(data):
                sent = datetime.fromisoformat(sent_at)
                self._items.extend((sent, record) for record in records)
            if block and self._items:
                return


def write_batch(writer: SqliteBatchWriter, items: Sequence[Item], now: datetime) -> list[Answer]:
    """Write the items in one transaction; their answers. When the batch fails for another
    reason than an unavailable database, each item is written alone."""
    rows = batch_rows(items, now)
    try:
        return list(receipts(rows, writer.write(rows), len(items)))
    except CONNECTION_ERRORS as exc:
        log.error("store unavailable: %s: %s", type(exc).__name__, exc)
        return [type(exc).__name__] * len(items)
    except Exception as exc:
        if len(items) == 1:
            log.exception("could not store an item")
            return [type(exc).__name__]
        log.warning("batch write failed (%s); writing its items one by one", type(exc).__name__)
        return [answer for item in items for answer in write_batch(writer, [item], now)]


def serve(
    database: str, sock: socket.socket, *, clock: Callable[[], float] = time.perf_counter
) -> None:
    """Write what comes over ``sock`` into ``database`` until the socket is closed."""
    writer = SqliteBatchWriter(database)
    inbox = Inbox(sock)
    limit = BatchLimit()
    try:
        while True:
            now, items = inbox.take(limit)
            if now is None:
                return
            started = clock()
            answers = write_batch(writer, items, now)
            sock.sendall(frame((now.isoformat(), answers)))
            limit.written(len(items), clock() - started)
    finally:
        writer.close()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m receivers.store.writer_process DATABASE", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl+C: it closes the socket
    logging.basicConfig(format="%(levelname)s: event writer process: %(message)s")
    with socket.socket(fileno=sys.stdin.fileno()) as sock:
        try:
            serve(argv[1], sock)
        except (BrokenPipeError, ConnectionResetError):
            return 1  # the server is gone; what was acknowledged is committed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
