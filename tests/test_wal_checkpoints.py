"""WAL checkpoints: taken beside the batch writer, not in its commits."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.rows import BatchRows
from receivers.store.sqlite_batches import SqliteBatchWriter
from receivers.store.wal_checkpoints import BACKSTOP_PAGES, WalCheckpointer
from tests.test_sqlite_batches import batch, event_rows

ROW_BYTES = 8192


class StoppedClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def writer_connection(database: Path) -> sqlite3.Connection:
    """A WAL connection whose commits never checkpoint."""
    conn = sqlite3.connect(database, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE IF NOT EXISTS blobs (body BLOB)")
    return conn


def add_rows(conn: sqlite3.Connection, count: int) -> None:
    conn.executemany("INSERT INTO blobs VALUES (?)", [(b"x" * ROW_BYTES,)] * count)


def test_a_checkpoint_copies_the_log_into_the_database_file(tmp_path: Path) -> None:
    database = tmp_path / "copy.db"
    conn = writer_connection(database)
    add_rows(conn, 50)
    before = database.stat().st_size
    checkpoints = WalCheckpointer(str(database), clock=StoppedClock())
    try:
        checkpoints.committed()
        checkpoints.wait()
        assert database.stat().st_size >= before + 50 * ROW_BYTES
        assert conn.execute("SELECT count(*) FROM blobs").fetchone() == (50,)
    finally:
        checkpoints.close()
        conn.close()


def test_checkpoints_are_at_least_an_interval_apart(tmp_path: Path) -> None:
    database = tmp_path / "spaced.db"
    conn = writer_connection(database)
    clock = StoppedClock()
    checkpoints = WalCheckpointer(str(database), interval=0.5, clock=clock)
    try:
        add_rows(conn, 10)
        checkpoints.committed()
        checkpoints.wait()
        first = database.stat().st_size

        add_rows(conn, 10)
        clock.now += 0.4
        checkpoints.committed()  # too soon: nothing is copied
        checkpoints.wait()
        assert database.stat().st_size == first

        clock.now += 0.1
        checkpoints.committed()
        checkpoints.wait()
        assert database.stat().st_size >= first + 10 * ROW_BYTES
    finally:
        checkpoints.close()
        conn.close()


def test_a_failed_checkpoint_is_logged_and_the_next_one_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    database = tmp_path / "later" / "retry.db"  # its directory does not exist yet
    clock = StoppedClock()
    checkpoints = WalCheckpointer(str(database), interval=0.1, clock=clock)
    try:
        with caplog.at_level(logging.WARNING, logger="receivers.store.wal_checkpoints"):
            checkpoints.committed()
            checkpoints.wait()
        assert "WAL checkpoint failed: unable to open database file" in caplog.text

        database.parent.mkdir()
        conn = writer_connection(database)
        add_rows(conn, 10)
        before = database.stat().st_size
        clock.now += 0.1
        checkpoints.committed()
        checkpoints.wait()
        assert database.stat().st_size >= before + 10 * ROW_BYTES
        conn.close()
    finally:
        checkpoints.close()


def big_batch(name: str, count: int) -> BatchRows:
    """``count`` new events of a little more than ROW_BYTES each."""
    rows = event_rows(*(f"{name}-{index}" for index in range(count)))
    for row in rows:
        row["raw_body"] = row["raw_body"] + b" " * ROW_BYTES
    return batch(rows)


def test_the_batch_writer_leaves_checkpoints_to_its_checkpointer(
    sqlite_engine: AsyncEngine,
) -> None:
    database = Path(str(sqlite_engine.url.database))
    clock = StoppedClock()
    checkpoints = WalCheckpointer(str(database), interval=60, clock=clock)
    writer = SqliteBatchWriter(str(database), checkpoints)
    try:
        writer.write(big_batch("first", 1))  # the first commit starts a checkpoint at once
        checkpoints.wait()
        after_first = database.stat().st_size

        for number in range(20):  # 1,800+ pages: past SQLite's default threshold of 1,000
            writer.write(big_batch(f"batch-{number}", 30))
        assert database.stat().st_size == after_first  # no commit copied the log back
        assert writer.connect().execute("PRAGMA wal_autocheckpoint").fetchone() == (BACKSTOP_PAGES,)

        clock.now += 60
        writer.write(big_batch("last", 1))
        checkpoints.wait()
        assert database.stat().st_size >= after_first + 20 * 30 * ROW_BYTES
    finally:
        writer.close()
