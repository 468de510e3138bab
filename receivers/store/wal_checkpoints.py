"""WAL checkpoints of a SQLite database, taken off the commit path.

In WAL mode, SQLite copies the log's pages back into the database file (a checkpoint) in the
connection whose commit takes the log past ``wal_autocheckpoint`` pages: by default every 1,000
pages, so one commit in a few dozen also pays for copying and syncing ~4 MB. The event writer's
process (:mod:`receivers.store.writer_process`) instead raises its own threshold to
:data:`BACKSTOP_PAGES` and calls :meth:`WalCheckpointer.committed` after each commit; the
checkpointer then runs a ``PASSIVE`` checkpoint (it neither waits for nor blocks writers and
readers) on a connection and thread of its own, at most every ``interval`` seconds. The
writer's backstop still checkpoints should these fall behind, e.g. when a long read keeps them
from copying, and brings the log back to its start (SQLite restarts the log only once it is
wholly copied before a write begins, which a checkpoint racing the writer's commits seldom
achieves on its own). Part of the writer process's speed trick: off with it.

SQLite's own automatic checkpoints would do without this module, on the commit path: with it,
``scripts/bench_ingest.py`` measured 0.473-0.485 against 0.446-0.469 (4 runs each).

Durability is unchanged: a commit is durable once its log frames are synced, whoever checkpoints.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from receivers.store.engine import CONNECT_TIMEOUT_SECONDS, sqlite_pragmas

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_SECONDS = 0.1
"""The shortest time between two background checkpoints."""
BACKSTOP_PAGES = 4_000
"""The writer's own ``wal_autocheckpoint`` (pages of usually 4 KiB: ~16 MB of log)."""


class WalCheckpointer:
    """Checkpoints one SQLite file's WAL in the background; see the module docstring.

    :meth:`committed` is called from one thread (the lane's), :meth:`close` once at the end.
    A run of failing checkpoints (a full disk) is logged once."""

    def __init__(
        self,
        database: str,
        *,
        interval: float = CHECKPOINT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._database = database
        self._interval = interval
        self._clock = clock
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-checkpoint")
        self._connection: sqlite3.Connection | None = None
        self._running: Future[None] | None = None
        self._last_start: float | None = None
        self._failing = False  # the checkpoint thread's alone

    def committed(self) -> None:
        """Note a commit: start a checkpoint unless one is running or one started too recently."""
        if self._running is not None and not self._running.done():
            return
        now = self._clock()
        if self._last_start is not None and now - self._last_start < self._interval:
            return
        self._last_start = now
        self._running = self._thread.submit(self._checkpoint)

    def wait(self) -> None:
        """Return once the checkpoint in progress, if any, has ended."""
        if self._running is not None:
            self._running.result()

    def close(self) -> None:
        """Wait for a running checkpoint, then release the connection and the thread."""
        self._thread.submit(self._disconnect).result()
        self._thread.shutdown()

    def _checkpoint(self) -> None:
        try:
            if self._connection is None:  # synchronous=FULL: the copy is synced too
                self._connection = sqlite3.connect(
                    self._database, timeout=CONNECT_TIMEOUT_SECONDS, isolation_level=None
                )
                sqlite_pragmas(self._connection)
            self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # the writer's backstop checkpoints meanwhile
            if not self._failing:
                log.warning("WAL checkpoint failed: %s; the log grows until one succeeds", exc)
                self._failing = True
            self._disconnect()
        else:
            self._failing = False

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
