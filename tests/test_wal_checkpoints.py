"""WAL checkpoints: taken beside the writer process, not in its commits."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.wal_checkpoints import WalCheckpointer
from receivers.store.writer_process import ProcessLane
from tests.store_support import NOW, arrival, eventually

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


def test_a_run_of_failed_checkpoints_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk fails every checkpoint until it has room: one line, not one per commit."""
    database = tmp_path / "later" / "retry.db"  # its directory does not exist yet
    clock = StoppedClock()
    checkpoints = WalCheckpointer(str(database), interval=0.1, clock=clock)
    try:
        with caplog.at_level(logging.WARNING, logger="receivers.store.wal_checkpoints"):
            for _ in range(5):
                clock.now += 0.1
                checkpoints.committed()
                checkpoints.wait()
    finally:
        checkpoints.close()
    assert caplog.text.count("WAL checkpoint failed") == 1


async def test_the_writer_process_checkpoints_in_the_background(
    sqlite_engine: AsyncEngine,
) -> None:
    """The writer process copies its commits into the database file as it goes (a few hundred
    pages here, well below SQLite's own threshold of 1,000, at which a commit would do it)."""
    database = Path(str(sqlite_engine.url.database))
    lane = ProcessLane(str(database), clock=lambda: NOW, on_stored=lambda _events: None)
    await lane.start()
    try:
        before = database.stat().st_size
        body = b"x" * ROW_BYTES
        await asyncio.gather(
            *(lane.submit(arrival(f"big{index}", raw_body=body)) for index in range(100))
        )

        async def copied() -> bool:
            # each commit lets the checkpointer run again, at most every 0.1 s
            await lane.submit(arrival("small"))
            return database.stat().st_size >= before + 100 * ROW_BYTES

        await eventually(copied)
        assert Path(f"{database}-wal").exists()  # the log is still in use: no connection closed
    finally:
        await lane.close()
