"""`relay serve` on a store that fills up: what the platform gets, what ``/readyz`` says, what
the log says (one WARNING, one INFO, no traceback), and that every acknowledged event is stored
and delivered. The real command runs in a subprocess: on SQLite capped in pages (with and without
the writer process; see tests/full_store_support.py), on PostgreSQL refusing writes by trigger."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from relay.outbox.tables import SUCCEEDED, Delivery
from relay.simulator import factories
from relay.store import migrate
from tests.conftest import (
    TOKEN,
    create_postgres_database,
    drop_postgres_database,
    service_missing,
)
from tests.full_store_support import (
    BIG_TEXT,
    ROOT,
    FillableStore,
    PostgresStore,
    SqliteStore,
    page_limit_environment,
)
from tests.store_support import eventually, stored_events
from tests.support import Sink, free_port, stop_process

pytestmark = pytest.mark.slow

URL = f"/hooks/sms/inbound?token={TOKEN}"
DELIVERIES = Delivery.__table__


@dataclass
class Store:
    """The server's store, the test's own engine on it, and the server's environment."""

    url: str
    engine: AsyncEngine
    fillable: FillableStore
    environment: dict[str, str]
    writer_process: bool


@pytest.fixture(
    params=[("sqlite", True), ("sqlite", False), ("postgresql", False)],
    ids=["sqlite-writer-process", "sqlite-in-process", "postgresql"],
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend, writer_process = request.param
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    if backend == "sqlite":
        database = tmp_path / "relay.db"
        url = f"sqlite:///{database}"
        engine = create_engine(url)
        await migrate.upgrade(engine)
        capped = SqliteStore(database)
        yield Store(
            url, engine, capped, page_limit_environment(capped.pages, environment), writer_process
        )
        await engine.dispose()
        return
    name, url = await create_postgres_database("relay_full")
    engine = create_engine(url)
    try:
        await migrate.upgrade(engine)
        triggered = PostgresStore(engine)
        await triggered.install()
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), environment.get("PYTHONPATH")])
        )
        yield Store(url, engine, triggered, environment, writer_process)
    finally:
        await engine.dispose()
        await drop_postgres_database(name)


@pytest.fixture
async def server(store: Store, sink: Sink, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """`relay serve` on the store, relaying to the sink: its base URL and its log file."""
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "{store.url}"\n'
        f"writer_process = {'true' if store.writer_process else 'false'}\n"
        'sweep_interval = "1s"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        f'[destinations.crm]\ntype = "http"\nurl = "{sink.url()}"\n'
    )
    port, log = free_port(), tmp_path / "server.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "relay", "serve", "--config", str(config), "--port", str(port)],
            cwd=tmp_path,
            env=store.environment,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        async def ready() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return (await httpx.AsyncClient().get(f"{base}/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, timeout=60)
        yield base, log
    finally:
        await asyncio.to_thread(stop_process, process)


def delivered(sink: Sink) -> set[str]:
    return {request.headers["webhook-id"] for request in sink.requests}


async def recorded(engine: AsyncEngine) -> set[str]:
    """The events whose deliveries are all recorded as succeeded."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(DELIVERIES.c.event_id, DELIVERIES.c.status))).all()
    pending = {event_id for event_id, status in rows if status != SUCCEEDED}
    return {event_id for event_id, _ in rows} - pending


def assert_store_full(answer: httpx.Response) -> None:
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["retry-after"] == "5"
    assert answer.json()["type"] == "urn:callback-relay:problem:store-full"


async def test_a_full_store_is_503_and_not_ready_with_one_warning_then_200_and_one_info(
    store: Store, server: tuple[str, Path], sink: Sink
) -> None:
    base, log = server
    body = factories.sms_inbound({"message": BIG_TEXT})  # its row needs a page of its own
    acknowledged: set[str] = set()
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:

        async def callback() -> httpx.Response:
            answer = await client.post(URL, json=factories.sms_inbound({"message": BIG_TEXT}))
            if answer.status_code == 200:
                acknowledged.add(answer.json()["id"])
            return answer

        for _ in range(5):
            assert (await callback()).status_code == 200

        async def relay_idle() -> bool:  # every delivery recorded: the relay has no work
            return await recorded(store.engine) == acknowledged

        await eventually(relay_idle)
        await store.fillable.fill()

        for _ in range(20):
            assert_store_full(await callback())
        for answer in await asyncio.gather(*(callback() for _ in range(40))):
            assert_store_full(answer)
        assert_store_full(await client.get("/readyz"))
        assert (await client.post(URL, json=body)).status_code == 503

        await store.fillable.make_room()
        assert (await callback()).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        await eventually(relay_idle)

    assert delivered(sink) == acknowledged
    stored = {row["id"] for row in (await stored_events(store.engine)).values()}
    assert stored == acknowledged and len(acknowledged) == 6
    output = log.read_text()
    assert "Traceback" not in output and "ERROR" not in output, output
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, output
    assert "the store refuses callbacks: it is full (" in warnings[0]
    taken = [line for line in output.splitlines() if "the store takes callbacks again" in line]
    assert len(taken) == 1 and " INFO " in taken[0], output


# --- a real full disk ----------------------------------------------------------------------------

DISK_BYTES = 2 << 20


@pytest.fixture
def namespaces() -> list[str]:
    """The command prefix that runs a program in a user and mount namespace of its own, where
    it may mount a tmpfs without root (unprivileged user namespaces)."""
    prefix = ["unshare", "--user", "--map-root-user", "--mount"]
    try:
        subprocess.run([*prefix, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        service_missing("unprivileged user namespaces (unshare)", exc)
    return prefix


async def test_a_real_full_disk_is_one_warning_and_room_made_there_one_info(
    namespaces: list[str], sink: Sink, tmp_path: Path
) -> None:
    """`relay serve` on a 2 MiB tmpfs of its own, filled up with a file: ENOSPC itself. The
    server's files are reached at /proc/PID/root (its own view of the mounts)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{disk / "relay.db"}"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        f'[destinations.crm]\ntype = "http"\nurl = "{sink.url()}"\n'
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), environment.get("PYTHONPATH")])
    )
    mount = f'mount -t tmpfs -o size={DISK_BYTES} tmpfs "$0" && exec "$@"'
    port, log = free_port(), tmp_path / "server.log"
    command = [sys.executable, "-m", "relay", "serve", "--config", str(config), "--port", str(port)]
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*namespaces, "sh", "-c", mount, str(disk), *command],
            cwd=tmp_path,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    seen = Path(f"/proc/{process.pid}/root") / disk.relative_to("/")
    acknowledged: set[str] = set()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

            async def ready() -> bool:
                assert process.poll() is None, log.read_text()
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            async def callback() -> httpx.Response:
                answer = await client.post(URL, json=factories.sms_inbound({"message": BIG_TEXT}))
                if answer.status_code == 200:
                    acknowledged.add(answer.json()["id"])
                return answer

            await eventually(ready, timeout=60)
            for _ in range(5):
                assert (await callback()).status_code == 200
            await eventually(lambda: delivered(sink) >= acknowledged)
            await asyncio.to_thread(fill_up, seen / "filler")

            answers = [await callback() for _ in range(30)]  # the log's room left, then none
            first_refused = next(i for i, a in enumerate(answers) if a.status_code == 503)
            for answer in answers[first_refused:]:
                assert_store_full(answer)
            assert_store_full(await client.get("/readyz"))

            (seen / "filler").unlink()
            assert (await callback()).status_code == 200
            assert (await client.get("/readyz")).status_code == 200
            await eventually(lambda: delivered(sink) >= acknowledged)
    finally:
        await asyncio.to_thread(stop_process, process)

    assert delivered(sink) == acknowledged
    output = log.read_text()
    assert "Traceback" not in output and "ERROR" not in output, output
    lines = output.splitlines()
    warnings = [line for line in lines if "WARNING" in line]
    refused = [line for line in warnings if "the store refuses callbacks: it is full (" in line]
    assert len(refused) == 1, output
    assert len([line for line in lines if "the store takes callbacks again" in line]) == 1, output
    # the callbacks the log still had room for were relayed, and their records may have found
    # the store full: the relay's writes say so once, and once more when they are taken again
    relay = [
        line for line in warnings if "the store refuses the relay's writes: it is full (" in line
    ]
    relay_taken = [line for line in lines if "the store takes the relay's writes again" in line]
    assert len(relay) == len(relay_taken) <= 1, output
    checkpoint = [line for line in warnings if "WAL checkpoint failed" in line]
    assert len(checkpoint) <= 1, output
    assert len(warnings) == len(refused) + len(relay) + len(checkpoint), output


def fill_up(path: Path) -> None:
    """Write zeros to ``path`` until the disk is full."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(descriptor, bytes(1 << 16))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(descriptor)
