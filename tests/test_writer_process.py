"""The writer process of a SQLite store and the lane to it: what goes over the socket, how the
process groups and answers, and what the callers get when it is gone."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from itertools import combinations
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel import SQLModel

from receivers.store import create_engine, writer_process
from receivers.store.batches import batch_rows, write_rows
from receivers.store.records import Receipt, StoreUnavailable
from receivers.store.writer import EventWriter
from receivers.store.writer_process import (
    FRAME_ITEMS,
    FrameReader,
    ProcessLane,
    WriterConnection,
    frame,
    item_of,
    record_of,
)
from relay.simulator import factories
from tests.conftest import TOKEN, running_client
from tests.store_support import (
    EVENTS,
    NOW,
    Stored,
    arrival,
    blocking_eventually,
    child_environment,
    eventually,
    rejected_bodies,
    rejection,
    stored_events,
    within,
    writer_processes,
)

# --- the wire ----------------------------------------------------------------------------------


def test_items_cross_the_wire_unchanged() -> None:
    items = [
        arrival("a", payload={"text": "héllo \ud800", "n": [1, 2.5, None, True], "big": 10**30}),
        arrival("b", content_type=None, remote_addr=None),
        rejection(b"\x00x", kind="sms.inbound", status=422),
    ]
    data = frame((NOW.isoformat(), [record_of(item) for item in items]))
    reader = FrameReader()
    values = [value for byte in range(len(data)) for value in reader.feed(data[byte : byte + 1])]
    assert len(values) == 1 and reader.pending == 0
    sent_at, records = values[0]
    assert sent_at == NOW.isoformat()
    assert [item_of(record) for record in records] == items


def test_frames_are_cut_out_however_the_stream_was_split() -> None:
    values = [("first", [1]), ("second", list(range(20))), ("third", [])]
    data = b"".join(frame(value) for value in values)
    for cuts in combinations(range(1, len(data)), 2):
        reader = FrameReader()
        pieces = [data[: cuts[0]], data[cuts[0] : cuts[1]], data[cuts[1] :]]
        got = [list(value) for piece in pieces for value in reader.feed(piece)]
        assert got == [list(value) for value in values], cuts
        assert reader.pending == 0
    reader = FrameReader()
    assert reader.feed(data[:-1]) == [values[0], values[1]] and reader.pending > 0


# --- the process -------------------------------------------------------------------------------


class Child:
    """A writer process started by the test, its input our end of a socket pair."""

    def __init__(self, database: str) -> None:
        self.socket, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "receivers.store.writer_process", database, "asyncio"],
                stdin=theirs,
                env=child_environment(),
            )
        self._reader = FrameReader()

    def send(self, *frames: tuple[str, list[tuple[object, ...]]]) -> None:
        self.socket.sendall(b"".join(frame(value) for value in frames))

    def answers(self, count: int) -> list[tuple[str, list[object]]]:
        """The answer frames until ``count`` items were answered."""
        frames: list[tuple[str, list[object]]] = []
        self.socket.settimeout(30)
        while sum(len(answers) for _, answers in frames) < count:
            data = self.socket.recv(1 << 16)
            assert data, "the writer process ended"
            frames += self._reader.feed(data)
        return frames

    def end(self) -> int:
        """Close its input (as when the server stops or dies); its exit status."""
        self.socket.shutdown(socket.SHUT_WR)
        try:
            return self.process.wait(timeout=30)
        finally:
            self.socket.close()


@pytest.fixture
def database(sqlite_engine: AsyncEngine) -> str:
    return str(sqlite_engine.url.database)


@pytest.fixture
def child(database: str) -> Iterator[Child]:
    started = Child(database)
    yield started
    if started.process.poll() is None:
        started.process.kill()
        started.process.wait()
    started.socket.close()


async def test_the_process_answers_each_item_in_order_and_ends_with_its_input(
    child: Child, sqlite_engine: AsyncEngine
) -> None:
    items = [arrival("a"), arrival("a"), rejection(b"no"), arrival("b")]
    child.send((NOW.isoformat(), [record_of(item) for item in items]))
    frames = child.answers(len(items))
    assert child.end() == 0

    answers = [answer for _, group in frames for answer in group]
    (a_id, a_duplicate, a_with), (same_id, copy_duplicate, _), quarantined, (b_id, b_dup, _) = (
        answers
    )
    assert a_with is None  # no in-commit writer was given
    assert a_id == same_id and b_id != a_id and quarantined is None
    assert (a_duplicate, copy_duplicate, b_dup) == (False, True, False)
    assert {received_at for received_at, _ in frames} == {NOW.isoformat()}
    rows = await stored_events(sqlite_engine)
    assert {key: (row["id"], row["duplicates"]) for key, row in rows.items()} == {
        "a": (a_id, 1),
        "b": (b_id, 0),
    }
    assert list(await rejected_bodies(sqlite_engine)) == [b"no"]


async def test_the_process_groups_what_has_arrived_sixteen_at_first(
    child: Child, sqlite_engine: AsyncEngine
) -> None:
    """A group takes what has arrived by the time it starts, the first capped at 16
    (:class:`AdaptiveGroupSize`); the rest wait for the next groups; a group is stamped with
    the latest sending time of its items."""
    late, later = NOW + timedelta(seconds=1), NOW + timedelta(seconds=2)
    keys = [f"k{index:03}" for index in range(100)]
    child.send(
        (NOW.isoformat(), [record_of(arrival(keys[0]))]),
        (later.isoformat(), [record_of(arrival(key)) for key in keys[1:10]]),
        (late.isoformat(), [record_of(arrival(key)) for key in keys[10:]]),
    )
    frames = child.answers(len(keys))
    assert child.end() == 0

    sizes = [len(answers) for _, answers in frames]
    assert sizes[0] == 16 and len(sizes) > 1 and sum(sizes) == 100 and max(sizes) <= 256
    assert frames[0][0] == later.isoformat()  # items 0-15: sent at NOW, later, late
    rows = await stored_events(sqlite_engine)
    assert rows[keys[0]]["received_at"] == later and rows[keys[15]]["received_at"] == later
    assert rows[keys[99]]["received_at"] == late


async def test_the_process_writes_in_transactions_rolled_back_as_a_whole(
    database: str, sqlite_engine: AsyncEngine
) -> None:
    """The process's driver connection autocommits, and SQLAlchemy begins each transaction
    itself: a write that fails after an insert leaves nothing behind."""
    connection = WriterConnection(database)
    try:
        assert await connection.transaction(
            lambda conn: write_rows(conn, batch_rows([arrival("new")], NOW))
        )

        def insert_then_fail(conn: sqlalchemy.Connection) -> None:
            conn.execute(sqlalchemy.insert(EVENTS), batch_rows([arrival("lost")], NOW).events)
            raise RuntimeError("after the insert")

        with pytest.raises(RuntimeError):
            await connection.transaction(insert_then_fail)
        assert await connection.transaction(
            lambda conn: write_rows(conn, batch_rows([arrival("kept")], NOW))
        )
    finally:
        connection.dispose()
    assert sorted(await stored_events(sqlite_engine)) == ["kept", "new"]


def test_the_process_starts_without_the_web_stack() -> None:
    """The writer process imports only what it needs, so that it starts quickly."""
    script = (
        "import sys, receivers.store.writer_process; "
        "print(sorted(m for m in ('starlette', 'uvicorn', 'httpx', 'redis', 'arq', 'relay') "
        "if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        env=child_environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "[]"


# --- the lane ----------------------------------------------------------------------------------


@pytest.fixture
async def lane(database: str) -> AsyncIterator[tuple[ProcessLane, Stored]]:
    stored = Stored()
    lane = ProcessLane(database, clock=lambda: NOW, on_stored=stored)
    await lane.start()
    yield lane, stored
    await lane.close()


async def test_the_lane_stores_at_its_clock_and_reports_new_events(
    lane: tuple[ProcessLane, Stored], sqlite_engine: AsyncEngine, database: str
) -> None:
    writer, stored = lane
    assert writer.available and len(writer_processes(database, count=1)) == 1
    futures = [writer.submit(item) for item in [arrival("a"), arrival("a"), rejection(b"no")]]
    first, copy, quarantined = await asyncio.gather(*futures)

    assert isinstance(first, Receipt) and not first.duplicate
    assert copy == Receipt(first.event_id, duplicate=True) and quarantined is None
    assert [(event.id, event.received_at, event.payload) for event in stored] == [
        (first.event_id, NOW, arrival("a").payload)
    ]
    row = (await stored_events(sqlite_engine))["a"]
    assert (row["id"], row["received_at"], row["duplicates"]) == (first.event_id, NOW, 1)
    assert row["payload"] == arrival("a").payload and row["raw_body"] == arrival("a").raw_body
    rejected = (await rejected_bodies(sqlite_engine))[b"no"]
    assert rejected["remote_addr"] == "10.0.0.1" and rejected["received_at"] == NOW


async def test_an_item_the_wire_cannot_carry_fails_alone(
    lane: tuple[ProcessLane, Stored], sqlite_engine: AsyncEngine
) -> None:
    writer, _ = lane
    odd = arrival("odd", payload={"requestId": "odd", "value": object()})  # marshal refuses it
    futures = [writer.submit(item) for item in [arrival("a"), odd, arrival("b")]]
    first, failed, last = await asyncio.gather(*futures, return_exceptions=True)

    assert isinstance(failed, StoreUnavailable)
    assert isinstance(first, Receipt) and isinstance(last, Receipt)
    rows = await stored_events(sqlite_engine)
    assert set(rows) == {"a", "b"}  # each answer went to its own caller
    assert (rows["a"]["id"], rows["b"]["id"]) == (first.event_id, last.event_id)


async def test_an_event_whose_caller_left_is_still_reported_as_stored(
    lane: tuple[ProcessLane, Stored], sqlite_engine: AsyncEngine
) -> None:
    writer, stored = lane
    gone = writer.submit(arrival("gone"))
    gone.cancel()  # the caller disconnected while its event was being written
    kept = await within(writer.submit(arrival("kept")))

    assert isinstance(kept, Receipt)
    await eventually(lambda: len(stored) == 2)
    assert sorted(event.payload["requestId"] for event in stored) == ["gone", "kept"]
    assert set(await stored_events(sqlite_engine)) == {"gone", "kept"}


async def test_a_full_frame_is_sent_before_the_event_loop_is_free_again(
    lane: tuple[ProcessLane, Stored], database: str
) -> None:
    """The writer process starts on the first ``FRAME_ITEMS`` items of a burst while the
    server's event loop is still busy with the rest; what is left goes at the end of the pass."""
    writer, _ = lane
    futures = [writer.submit(arrival(f"k{index}")) for index in range(FRAME_ITEMS + 3)]

    def stored_now() -> int:  # read while this event loop is kept busy
        with sqlite3.connect(database) as conn:
            return int(conn.execute("SELECT count(*) FROM received_events").fetchone()[0])

    blocking_eventually(lambda: stored_now() >= FRAME_ITEMS)
    assert stored_now() == FRAME_ITEMS  # the rest waits for this pass of the loop to end
    receipts = await asyncio.gather(*futures)
    assert all(isinstance(receipt, Receipt) for receipt in receipts)
    assert stored_now() == FRAME_ITEMS + 3


async def test_closing_writes_everything_handed_over(
    database: str, sqlite_engine: AsyncEngine
) -> None:
    stored = Stored()
    writer = ProcessLane(database, clock=lambda: NOW, on_stored=stored)
    await writer.start()
    futures = [writer.submit(arrival(f"k{index}")) for index in range(500)]
    await writer.close()

    assert all(future.done() and not future.exception() for future in futures)
    assert len(stored) == 500 and len(await stored_events(sqlite_engine)) == 500
    assert not writer.running and not writer.available
    assert writer_processes(database) == []  # it ended and was reaped
    with pytest.raises(StoreUnavailable):
        writer.submit(arrival("late"))


@pytest.fixture
def write_lock(database: str) -> Iterator[sqlite3.Connection]:
    """A connection holding the database's write lock: the writer process's next group waits
    for it (up to its busy timeout)."""
    blocker = sqlite3.connect(database, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    yield blocker
    if blocker.in_transaction:
        blocker.rollback()
    blocker.close()


@pytest.mark.slow
async def test_a_killed_process_fails_its_callers_and_another_one_takes_over(
    lane: tuple[ProcessLane, Stored],
    database: str,
    write_lock: sqlite3.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(writer_process, "RESTART_DELAY_SECONDS", 0.5)
    writer, _ = lane
    [pid] = writer_processes(database, count=1)
    waiting = [writer.submit(arrival(f"lost{index}")) for index in range(FRAME_ITEMS)]
    os.kill(pid, signal.SIGKILL)

    for future in waiting:
        with pytest.raises(StoreUnavailable):
            async with asyncio.timeout(30):
                await future
    assert not writer.available
    with pytest.raises(StoreUnavailable):
        writer.submit(arrival("while down"))
    write_lock.rollback()  # nothing of the killed process's group was committed

    await eventually(lambda: writer.available)
    [new_pid] = writer_processes(database, count=1)
    assert new_pid != pid
    again = await writer.submit(arrival("lost0"))
    assert isinstance(again, Receipt) and not again.duplicate


@pytest.mark.slow
async def test_the_server_is_not_ready_while_its_writer_process_is_restarted(
    sqlite_engine: AsyncEngine, database: str
) -> None:
    url, body = f"/hooks/sms/inbound?token={TOKEN}", factories.sms_inbound()
    async with running_client(sqlite_engine) as client:
        assert (await client.get("/readyz")).status_code == 200
        [pid] = writer_processes(database, count=1)
        os.kill(pid, signal.SIGKILL)

        async def not_ready() -> bool:
            return (await client.get("/readyz")).status_code == 503

        await eventually(not_ready)
        down = await client.get("/readyz")
        callback = await client.post(url, json=body)
        for answer in (down, callback):
            assert answer.status_code == 503
            assert answer.headers["content-type"] == "application/problem+json"
            assert answer.headers["retry-after"] == "5"

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await eventually(ready)
        stored = await client.post(url, json=body)
        assert stored.status_code == 200
        assert list(await stored_events(sqlite_engine)) == [body["requestId"]]
        assert writer_processes(database) != [pid]


async def test_a_stuck_process_cannot_hold_up_closing(
    database: str, write_lock: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_process, "EXIT_TIMEOUT_SECONDS", 0.3)
    writer = ProcessLane(database, clock=lambda: NOW, on_stored=Stored())
    await writer.start()
    stuck = writer.submit(arrival("stuck"))  # waits for the lock for up to 5 s
    async with asyncio.timeout(3):
        await writer.close()
    with pytest.raises(StoreUnavailable):
        stuck.result()
    assert writer_processes(database) == []  # killed after the timeout, and reaped


async def test_a_writer_process_and_another_writer_store_each_event_once(
    lane: tuple[ProcessLane, Stored], sqlite_engine: AsyncEngine
) -> None:
    """Another server on the same file (here one writing in its own process) and the writer
    process race for the same events: each is stored once, its copy counted."""
    writer, _ = lane
    other = EventWriter(sqlite_engine, clock=lambda: NOW, writer_process=False)
    await other.start()
    keys = [f"k{index}" for index in range(50)]
    try:
        ours = [writer.submit(arrival(key)) for key in keys]
        theirs = [asyncio.ensure_future(other.store(arrival(key))) for key in keys]
        answers = await asyncio.gather(*ours, *theirs)
    finally:
        await other.stop()

    rows = await stored_events(sqlite_engine)
    assert set(rows) == set(keys)
    for index, key in enumerate(keys):
        mine, their = answers[index], answers[len(keys) + index]
        assert mine.event_id == their.event_id == rows[key]["id"]
        assert sorted([mine.duplicate, their.duplicate]) == [False, True]
        assert rows[key]["duplicates"] == 1


async def test_a_database_path_with_percent_escapes_is_the_file_the_server_reads(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a%2541.db"  # a URL parser would read %25 as "%" and then %41 as "A"
    engine = create_engine(sqlalchemy.URL.create("sqlite", database=str(path)).render_as_string())
    async with engine.begin() as conn:
        await conn.run_sync(SQLModel.metadata.create_all)
    try:
        async with running_client(engine) as client:
            answer = await client.post(
                f"/hooks/sms/inbound?token={TOKEN}", json=factories.sms_inbound()
            )
        assert answer.status_code == 200, answer.text
        assert list(tmp_path.glob("*.db")) == [path]
        stored = await stored_events(engine)
        assert [row["id"] for row in stored.values()] == [answer.json()["id"]]
    finally:
        await engine.dispose()
