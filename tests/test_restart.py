"""Restarts keep everything: in-process app restarts, and a real server killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import queries
from receivers.store.engine import create_engine
from relay.simulator import factories
from tests.conftest import TOKEN, running_client
from tests.support import free_port

pytestmark = pytest.mark.slow


async def test_restart_keeps_every_event_and_the_dedup_memory(
    engine: AsyncEngine, database_url: str
) -> None:
    bodies = [factories.sms_inbound() for _ in range(20)]
    async with running_client(engine) as client:
        first_ids = [
            (await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=b)).json()["id"]
            for b in bodies
        ]
    await engine.dispose()

    reopened = create_engine(database_url)
    try:
        async with running_client(reopened) as client:
            again = [
                (await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=b)).json()["id"]
                for b in bodies
            ]
        events = await queries.list_events(reopened, limit=100)
    finally:
        await reopened.dispose()
    assert again == first_ids
    assert {e.id for e in events} == set(first_ids)
    assert all(e.duplicates == 1 for e in events)


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_server(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relay",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=config.parent,
        env={**os.environ, "RELAY_CONFIG": ""},
        preexec_fn=default_sigint,  # as in a terminal, whatever the test runner's is
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(f"server did not start: {log.read_text()}")


def test_acked_events_survive_sigkill_of_a_real_server(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "relay.db"}"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
    )
    port = free_port()
    server = start_server(config, port, tmp_path / "server.log")
    acked: set[str] = set()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(100):
                answer = client.post(f"/hooks/sms/dlr?token={TOKEN}", json=factories.sms_dlr())
                assert answer.status_code == 200
                acked.add(answer.json()["id"])
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()

    server = start_server(config, port, tmp_path / "server.log")
    server.terminate()
    server.wait(timeout=30)
    listing = subprocess.run(
        [
            sys.executable,
            "-m",
            "relay",
            "events",
            "list",
            "--json",
            "--limit",
            "1000",
            "--config",
            str(config),
        ],
        capture_output=True,
        check=True,
        text=True,
    )
    stored = {event["id"] for event in json.loads(listing.stdout)}
    assert stored == acked


def test_ctrl_c_stops_a_real_server_quietly_with_status_0(tmp_path: Path) -> None:
    """uvicorn raises the SIGINT it caught again after its graceful stop: that must neither
    cut the closing of the database short (a traceback) nor make click print "Aborted!"."""
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "relay.db"}"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
    )
    port, log = free_port(), tmp_path / "server.log"
    server = start_server(config, port, log)
    try:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/hooks/sms/dlr?token={TOKEN}", json=factories.sms_dlr()
        )
        assert answer.status_code == 200
    finally:
        server.send_signal(signal.SIGINT)
        status = server.wait(timeout=30)
    output = log.read_text()
    assert status == 0, output
    assert "Traceback" not in output and "Aborted" not in output and "ERROR" not in output
