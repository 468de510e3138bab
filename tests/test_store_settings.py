"""The ``writer_process`` setting: refused when it is no boolean; off, a SQLite file's events are
written in the server's own process, and nothing is lost either way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import ReceiverConfig, SourceConfig
from receivers.store import queries
from relay.settings import Settings, SettingsError, load_settings
from relay.simulator import factories
from tests.conftest import TOKEN, running_client
from tests.store_support import writer_processes


@pytest.mark.parametrize(
    "line",
    [
        'writer_process = "maybe"',
        'writer_process = ""',
        "writer_process = 2",
        "writer_process = []",
        "writer_process = {}",
    ],
)
def test_a_writer_process_that_is_no_boolean_is_refused(tmp_path: Path, line: str) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(line + "\n")
    with pytest.raises(SettingsError) as refused:
        load_settings(config)
    assert "writer_process: Input should be a valid boolean" in str(refused.value)


def test_writer_process_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().writer_process is True
    monkeypatch.setenv("RELAY_WRITER_PROCESS", "false")
    assert Settings().writer_process is False
    monkeypatch.setenv("RELAY_WRITER_PROCESS", "perhaps")
    with pytest.raises(ValueError, match="writer_process"):
        Settings()


@pytest.mark.parametrize("writer_process", [True, False])
async def test_events_are_stored_with_and_without_the_writer_process(
    sqlite_engine: AsyncEngine, writer_process: bool
) -> None:
    body = factories.sms_inbound()
    async with running_client(sqlite_engine, writer_process=writer_process) as client:
        answer = await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)
        children = writer_processes(
            str(sqlite_engine.url.database), count=1 if writer_process else None
        )
    assert answer.status_code == 200, answer.text
    assert len(children) == (1 if writer_process else 0)
    stored = await queries.get_event(sqlite_engine, answer.json()["id"])
    assert stored is not None and stored.payload["requestId"] == body["requestId"]


@pytest.mark.parametrize("value", ["false", "", 0, None])
def test_a_receiver_config_writer_process_must_be_a_boolean(value: object) -> None:
    with pytest.raises(ValueError, match="writer_process must be true or false"):
        ReceiverConfig(sources={"default": SourceConfig(token=TOKEN)}, writer_process=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "not a database URL"),
        ("relay.db", "not a database URL"),
        ("mysql://user:hunter2@h/db", "mysql:// is not supported"),
        ("postgresql+psycopg://h/db", "postgresql+psycopg:// is not supported"),
        ("sqlite://relay.db", "three slashes before a relative path"),
        ("sqlite:///", "SQLite needs a file"),
        ("sqlite:///:memory:", "SQLite needs a file"),
    ],
)
def test_a_database_url_the_store_cannot_use_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, message: str
) -> None:
    monkeypatch.setenv("RELAY_DATABASE_URL", url)
    with pytest.raises(
        SettingsError, match=rf"database_url \(from RELAY_DATABASE_URL\): .*{re.escape(message)}"
    ) as err:
        load_settings(None)
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///relay.db",
        "sqlite+aiosqlite:////tmp/x.db",
        "postgresql://u@h/db",
        "postgres://h/d",
    ],
)
def test_database_urls_of_the_store_are_taken(url: str) -> None:
    assert Settings(database_url=url).database_url == url
