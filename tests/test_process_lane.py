"""The writer process of a SQLite store and the lane to it: what goes over the socket, how the
process batches and answers, and what the callers get when it is gone."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import process_lane
from receivers.store.batch_limit import BatchLimit
from receivers.store.lane_wire import FrameReader, frame, item_of, record_of
from receivers.store.process_lane import ProcessLane
from receivers.store.records import Arrival, Receipt, Rejection, StoredEvent, StoreUnavailable
from receivers.store.sqlite_batches import SqliteBatchWriter
from receivers.store.tables import ReceivedEvent, RejectedBody
from receivers.store.writer_process import Inbox, write_batch
from relay.simulator import factories
from tests.conftest import TOKEN, running_client

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EVENTS = ReceivedEvent.__table__


def arrival(key: str, **changes: Any) -> Arrival:
    fields: dict[str, Any] = {
        "source": "default",
        "kind": "sms.inbound",
        "dedup_key": key,
        "payload": {"requestId": key, "text": "héllo \ud800", "n": [1, 2.5, None, True]},
        "raw_body": b'{"requestId": "%s"}' % key.encode(),
        "content_type": "application/json",
        "method": "POST",
        "remote_addr": "127.0.0.1",
    }
    return Arrival(**(fields | changes))


def rejection(body: bytes) -> Rejection:
    return Rejection(
        source="default",
        path="/hooks/sms/inbound",
        kind=None,
        status=400,
        reason="The body is not JSON.",
        errors=[],
        raw_body=body,
        content_type=None,
        remote_addr="10.0.0.1",
    )


# --- the wire ----------------------------------------------------------------------------------


def test_items_cross_the_wire_unchanged() -> None:
    items = [arrival("a"), arrival("b", content_type=None, remote_addr=None), rejection(b"\x00x")]
    data = frame((NOW.isoformat(), [record_of(item) for item in items]))
    reader = FrameReader()
    values = [value for byte in range(len(data)) for value in reader.feed(data[byte : byte + 1])]
    assert len(values) == 1 and reader.pending == 0
    sent_at, records = values[0]
    assert sent_at == NOW.isoformat()
    assert [item_of(record) for record in records] == items


def fixed(size: int) -> BatchLimit:
    return BatchLimit(smallest=size, largest=size)


def test_the_inbox_takes_everything_that_has_arrived_up_to_its_limit() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        inbox = Inbox(theirs)
        early, late = NOW.isoformat(), (NOW + timedelta(seconds=1)).isoformat()
        first = frame((early, [record_of(arrival(key)) for key in "abc"]))
        second = frame((late, [record_of(arrival(key)) for key in "de"]))
        ours.sendall(first + second[:5])  # the second frame is incomplete for now
        sent_at, items = inbox.take(fixed(10))
        assert sent_at == NOW and [item.dedup_key for item in items] == ["a", "b", "c"]

        ours.sendall(second[5:])
        sent_at, items = inbox.take(fixed(1))
        assert sent_at == NOW + timedelta(seconds=1)
        assert [item.dedup_key for item in items] == ["d"]
        ours.close()
        assert [item.dedup_key for item in inbox.take(fixed(10))[1]] == ["e"]
        assert inbox.take(fixed(10))[1] == [] and inbox.closed


def test_the_inbox_tells_the_limit_whether_it_had_to_wait() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        inbox = Inbox(theirs)
        limit = BatchLimit(smallest=1, largest=4)
        limit.value = 4
        ours.sendall(frame((NOW.isoformat(), [record_of(arrival(key)) for key in "abcdef"])))
        assert len(inbox.take(limit)[1]) == 4 and limit.value == 4  # items were waiting
        assert len(inbox.take(limit)[1]) == 2 and limit.value == 4
        ours.close()  # nothing waits now: the inbox waits (here, for the end of its input)
        assert inbox.take(limit)[1] == [] and limit.value == 2


# --- the process's batches -------------------------------------------------------------------


@pytest.fixture
def batches(sqlite_engine: AsyncEngine) -> Iterator[SqliteBatchWriter]:
    writer = SqliteBatchWriter(str(sqlite_engine.url.database))
    yield writer
    writer.close()


def test_a_batch_answers_each_item_in_order(batches: SqliteBatchWriter) -> None:
    [(stored_id, duplicate)] = write_batch(batches, [arrival("old")], NOW)  # type: ignore[misc]
    assert not duplicate

    answers = write_batch(
        batches, [arrival("a"), rejection(b"x"), arrival("old"), arrival("a"), arrival("b")], NOW
    )
    a, quarantined, old, a_again, b = answers
    assert quarantined is None
    assert isinstance(a, tuple) and isinstance(b, tuple) and a[0] != b[0]
    assert a == (a[0], False) and a_again == (a[0], True) and b == (b[0], False)
    assert old == (stored_id, True)


def test_an_item_that_cannot_be_written_fails_alone(batches: SqliteBatchWriter) -> None:
    unencodable = arrival("bad", payload={"what": object()})
    answers = write_batch(batches, [arrival("a"), unencodable, arrival("b")], NOW)
    assert answers[1] == "TypeError"
    assert isinstance(answers[0], tuple) and isinstance(answers[2], tuple)


def test_an_unavailable_database_fails_the_whole_batch(tmp_path: Path) -> None:
    writer = SqliteBatchWriter(str(tmp_path / "missing" / "relay.db"))
    try:
        answers = write_batch(writer, [arrival("a"), rejection(b"x")], NOW)
    finally:
        writer.close()
    assert answers == ["OperationalError", "OperationalError"]


def test_the_process_writes_answers_and_ends_with_its_input(sqlite_engine: AsyncEngine) -> None:
    database = str(sqlite_engine.url.database)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        process = subprocess.Popen(
            [sys.executable, "-m", "receivers.store.writer_process", database],
            stdin=theirs,
            env=process_lane._child_environment(),
        )
        ours.sendall(frame((NOW.isoformat(), [record_of(arrival("a")), record_of(arrival("a"))])))
        reader = FrameReader()
        while not (answers := reader.feed(ours.recv(65536))):
            pass
        ours.shutdown(socket.SHUT_WR)  # as when the server stops or dies
        assert process.wait(timeout=30) == 0
    [(received_at, [(event_id, first_duplicate), (same_id, second_duplicate)])] = answers
    assert received_at == NOW.isoformat()
    assert event_id == same_id and (first_duplicate, second_duplicate) == (False, True)


# --- the lane ----------------------------------------------------------------------------------


class Stored(list[StoredEvent]):
    def __call__(self, events: list[StoredEvent]) -> None:
        self.extend(events)


@pytest.fixture
async def lane(sqlite_engine: AsyncEngine) -> AsyncIterator[tuple[ProcessLane, Stored]]:
    stored = Stored()
    lane = ProcessLane(str(sqlite_engine.url.database), clock=lambda: NOW, on_stored=stored)
    await lane.start()
    yield lane, stored
    await lane.close()


async def test_items_go_out_in_frames_of_frame_items_and_at_the_end_of_the_loops_pass() -> None:
    lane = ProcessLane("unused.db", clock=lambda: NOW, on_stored=Stored())
    written: list[bytes] = []
    lane._loop = asyncio.get_running_loop()  # a transport of our own instead of a process
    lane._connected(cast(asyncio.Transport, SimpleNamespace(write=written.append)))
    keys = [f"k{index}" for index in range(process_lane.FRAME_ITEMS + 3)]
    for key in keys:
        lane.submit(arrival(key))

    def sent() -> list[list[str]]:
        reader = FrameReader()
        frames = [records for data in written for _, records in reader.feed(data)]
        return [[item_of(record).dedup_key for record in records] for records in frames]

    assert sent() == [keys[: process_lane.FRAME_ITEMS]]  # the writer can start on these
    await asyncio.sleep(0)  # the end of this pass of the event loop
    assert sent() == [keys[: process_lane.FRAME_ITEMS], keys[process_lane.FRAME_ITEMS :]]


async def test_the_lane_stores_at_its_clock_and_reports_new_events(
    lane: tuple[ProcessLane, Stored], sqlite_engine: AsyncEngine
) -> None:
    writer, stored = lane
    futures = [writer.submit(item) for item in [arrival("a"), arrival("a"), rejection(b"no")]]
    first, copy, quarantined = await asyncio.gather(*futures)

    assert isinstance(first, Receipt) and not first.duplicate
    assert copy == Receipt(first.event_id, duplicate=True) and quarantined is None
    assert [(event.id, event.received_at, event.payload) for event in stored] == [
        (first.event_id, NOW, arrival("a").payload)
    ]
    async with sqlite_engine.connect() as conn:
        row = (await conn.execute(select(EVENTS))).mappings().one()
        rejected = (await conn.execute(select(RejectedBody.__table__))).mappings().one()
    assert (row["id"], row["received_at"], row["duplicates"]) == (first.event_id, NOW, 1)
    assert row["payload"] == arrival("a").payload and row["raw_body"] == arrival("a").raw_body
    assert rejected["raw_body"] == b"no" and rejected["remote_addr"] == "10.0.0.1"


async def test_closing_writes_everything_handed_over(sqlite_engine: AsyncEngine) -> None:
    stored = Stored()
    writer = ProcessLane(str(sqlite_engine.url.database), clock=lambda: NOW, on_stored=stored)
    await writer.start()
    futures = [writer.submit(arrival(f"k{index}")) for index in range(500)]
    await writer.close()

    assert all(future.done() and not future.exception() for future in futures)
    assert len(stored) == 500 and not writer.running
    with pytest.raises(StoreUnavailable):
        writer.submit(arrival("late"))


async def test_a_dead_process_fails_its_callers_and_another_one_takes_over(
    lane: tuple[ProcessLane, Stored],
    sqlite_engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_lane, "RESTART_DELAY_SECONDS", 0.05)
    writer, _ = lane
    assert isinstance(await writer.submit(arrival("before")), Receipt)  # the process is up

    blocker = sqlite3.connect(str(sqlite_engine.url.database), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # holds the write lock: the next batch waits for it
    try:
        waiting = writer.submit(arrival("lost"))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        process = writer._process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(StoreUnavailable):
            async with asyncio.timeout(30):
                await waiting
        with pytest.raises(StoreUnavailable):
            writer.submit(arrival("while down"))
    finally:
        blocker.rollback()
        blocker.close()

    async with asyncio.timeout(30):
        while not writer.running:
            await asyncio.sleep(0.02)
    again = await writer.submit(arrival("after"))
    assert isinstance(again, Receipt) and not again.duplicate


async def test_the_server_is_not_ready_while_its_writer_process_is_restarted(
    sqlite_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_lane, "RESTART_DELAY_SECONDS", 0.3)
    url, body = f"/hooks/sms/inbound?token={TOKEN}", factories.sms_inbound()
    async with running_client(sqlite_engine) as client:
        assert (await client.get("/readyz")).status_code == 200
        lane = client.app.state.writer._lane  # type: ignore[attr-defined]
        assert isinstance(lane, ProcessLane) and lane._process is not None
        os.kill(lane._process.pid, signal.SIGKILL)
        async with asyncio.timeout(30):
            while lane.running:
                await asyncio.sleep(0.01)

        down = await client.get("/readyz")
        callback = await client.post(url, json=body)
        for answer in (down, callback):
            assert answer.status_code == 503
            assert answer.headers["content-type"] == "application/problem+json"
            assert answer.headers["retry-after"] == "5"

        async with asyncio.timeout(30):
            while not lane.running:
                await asyncio.sleep(0.02)
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.post(url, json=body)).status_code == 200


def test_the_process_starts_without_the_web_stack() -> None:
    """The writer process imports only what it needs, so that it starts quickly."""
    script = (
        "import sys, receivers.store.writer_process; "
        "print(sorted(m for m in ('sqlalchemy', 'sqlmodel', 'starlette', 'uvicorn', 'httpx') "
        "if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        env=process_lane._child_environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "[]"


async def test_a_stuck_process_cannot_hold_up_closing(
    sqlite_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_lane, "EXIT_TIMEOUT_SECONDS", 0.3)
    writer = ProcessLane(str(sqlite_engine.url.database), clock=lambda: NOW, on_stored=Stored())
    await writer.start()
    blocker = sqlite3.connect(str(sqlite_engine.url.database), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the process waits up to 5 s for this lock
    try:
        stuck = writer.submit(arrival("stuck"))
        async with asyncio.timeout(3):
            await writer.close()
        with pytest.raises(StoreUnavailable):
            stuck.result()
        assert writer._process is None  # reaped (killed after the timeout)
    finally:
        blocker.rollback()
        blocker.close()
