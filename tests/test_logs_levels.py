"""What each log level shows: at ``info``, start-up, state changes and a line per failed attempt,
never a line per delivery or per job; at ``debug``, a line per delivery too."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from receivers.store.engine import create_engine
from relay.observe.logs import DEBUG_ONLY_LOGGERS, configure_logging
from relay.simulator import factories
from relay.store import inspect
from tests.conftest import TOKEN
from tests.store_support import child_environment, eventually
from tests.support import Answer, Sink, free_port, serving, stop_process

LOG_OPTIONS = ("--log-format", "json", "--log-level")
DELIVERED = 3
"""Callbacks sent to the destination that takes them."""


@pytest.fixture
def root_logger() -> Iterator[None]:
    """Put the root logger, and the levels configure_logging sets, back after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in DEBUG_ONLY_LOGGERS}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


@pytest.mark.parametrize("level", ["info", "warning", "debug"])
@pytest.mark.parametrize("name", ["httpx", "httpcore.http11", "arq.worker", "arq.jobs"])
def test_per_request_and_per_job_loggers_tell_their_routine_lines_at_debug_only(
    root_logger: None, name: str, level: str
) -> None:
    stream = io.StringIO()
    handler = configure_logging(level)
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    logger = logging.getLogger(name)
    logger.debug("a debug line")
    logger.info("a routine line")
    logger.warning("a warning line")
    printed = stream.getvalue()
    assert ("a routine line" in printed) is (level == "debug")
    assert ("a debug line" in printed) is (level == "debug")
    assert "a warning line" in printed


def test_the_relay_s_own_info_lines_stay_at_info(root_logger: None) -> None:
    stream = io.StringIO()
    handler = configure_logging("info")
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    logging.getLogger("relay.worker").info("relay worker started")
    assert "relay worker started" in stream.getvalue()


async def serve_and_deliver(tmp_path: Path, level: str) -> tuple[list[dict[str, Any]], Any]:
    """Run `relay serve` at ``level`` (JSON lines) with a destination that takes every callback
    and one that refuses it (503, one attempt an hour); send it callbacks, wait until every
    delivery was attempted, stop it: its log lines and its deliveries."""
    database = tmp_path / "relay.db"
    log_file = tmp_path / "stderr.log"
    async with serving(Sink()) as sink:
        sink.answers["/down"] = Answer(503)
        (tmp_path / "relay.toml").write_text(
            f'database_url = "sqlite:///{database}"\n'
            f'[sources.default]\ntoken = "{TOKEN}"\n'
            f'[destinations.crm]\ntype = "http"\nurl = "{sink.url("/crm")}"\n'
            'kinds = ["sms.inbound"]\n'
            f'[destinations.down]\ntype = "http"\nurl = "{sink.url("/down")}"\n'
            'kinds = ["sms.dlr"]\npolicy = "hourly"\n'
            '[policies.hourly]\ntype = "delays"\ndelays = ["1h"]\n'
        )
        port = free_port()
        with log_file.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "relay", "serve", "--port", str(port), *LOG_OPTIONS, level],
                cwd=tmp_path,  # finds ./relay.toml
                env={k: v for k, v in child_environment().items() if not k.startswith("RELAY_")},
                stderr=stderr,
                stdout=subprocess.DEVNULL,
            )
        engine = create_engine(f"sqlite:///{database}")
        try:
            await eventually(lambda: b"Uvicorn running" in log_file.read_bytes())
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(DELIVERED):
                    inbound = factories.sms_inbound()
                    answer = await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=inbound)
                    assert answer.status_code == 200, answer.text
                dlr = factories.sms_dlr()
                answer = await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=dlr)
                assert answer.status_code == 200, answer.text

            async def all_attempted() -> list[dict[str, Any]]:
                rows = await inspect.list_deliveries(engine)
                done = len(rows) == DELIVERED + 1 and all(row["attempts"] for row in rows)
                return rows if done else []

            deliveries = await eventually(all_attempted)
        finally:
            await engine.dispose()
            stop_process(process)  # type: ignore[arg-type]
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    return lines, deliveries


@pytest.mark.slow
async def test_at_info_serve_tells_no_line_per_delivery_but_one_per_failed_attempt(
    tmp_path: Path,
) -> None:
    lines, deliveries = await serve_and_deliver(tmp_path, "info")
    messages = [str(line["message"]) for line in lines]
    assert any(m.startswith("relay worker started") for m in messages)
    assert [line for line in lines if line["logger"].split(".")[0] in ("httpx", "httpcore")] == []
    [failed] = [row for row in deliveries if row["destination"] == "down"]
    delivered = [row for row in deliveries if row["destination"] == "crm"]
    assert len(delivered) == DELIVERED and all(r["status"] == "succeeded" for r in delivered)
    for row in delivered:
        assert [m for m in messages if row["id"] in m or row["event_id"] in m] == []
    [told] = [line for line in lines if failed["id"] in str(line["message"])]
    assert told["level"] == "info" and told["logger"] == "relay.delivery"
    assert told["message"].startswith(f"attempt 1 of delivery {failed['id']} to down failed")
    assert {line["level"] for line in lines} <= {"info", "warning"}


@pytest.mark.slow
async def test_at_debug_serve_tells_each_delivery(tmp_path: Path) -> None:
    lines, deliveries = await serve_and_deliver(tmp_path, "debug")
    requests = [line for line in lines if str(line["message"]).startswith("HTTP Request: POST")]
    assert len([r for r in requests if "/crm" in str(r["message"])]) == DELIVERED
    for row in deliveries:
        if row["destination"] == "crm":
            [told] = [
                line
                for line in lines
                if line.get("delivery_id") == row["id"] and line["logger"] == "relay.delivery"
            ]
            assert told["level"] == "debug" and "succeeded" in told["message"]
