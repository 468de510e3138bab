"""`relay store prune --before DATE [--dry-run]`: what it prints and removes, the forms of DATE,
its progress bar, and a one-line usage error (exit status 2) for every hostile argument."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import text

from receivers.store import create_engine
from relay.cli import main
from relay.commands.retention import parse_cutoff
from relay.observe import progress
from relay.store import migrate, retention
from tests.conftest import TABLES, TOKEN
from tests.retention_support import Left, Planned, event_with, left, quarantine

OLD = datetime(2025, 1, 10, tzinfo=UTC)
SUMMARY = "2 events, 2 deliveries, 4 attempts and 1 quarantined body"


async def _seed(database_url: str) -> Left:
    """A store with, received at :data:`OLD`: two events whose deliveries ended (2 of them,
    2 attempts each; the other event had no destination), one with a pending delivery, one
    never routed, a quarantined body; and an event of today. What is stored, before any
    prune."""
    engine = create_engine(database_url)
    try:
        if engine.dialect.name == "sqlite":
            await migrate.upgrade(engine)
        else:
            async with engine.begin() as conn:
                await conn.execute(text(f"TRUNCATE {', '.join(TABLES)}"))
        done = OLD + timedelta(hours=1)
        await event_with(engine, "ended", OLD, [Planned("succeeded", done), Planned("dead", done)])
        await event_with(engine, "no destination", OLD, [])
        await event_with(engine, "pending", OLD, [Planned("succeeded", done), Planned("pending")])
        await event_with(engine, "unrouted", OLD, None)
        await quarantine(engine, b"{old", OLD)
        now = datetime.now(UTC)
        await event_with(engine, "today", now, [Planned("succeeded", now)])
        return await left(engine)
    finally:
        await engine.dispose()


async def _left(database_url: str) -> Left:
    engine = create_engine(database_url)
    try:
        return await left(engine)
    finally:
        await engine.dispose()


def _config(tmp_path: Path, database_url: str) -> str:
    config = tmp_path / "relay.toml"
    config.write_text(f'database_url = "{database_url}"\n[sources.default]\ntoken = "{TOKEN}"\n')
    return str(config)


def prune(config: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["store", "prune", "--config", config, *args])


def test_a_dry_run_counts_what_the_prune_then_removes(tmp_path: Path, database_url: str) -> None:
    stored = asyncio.run(_seed(database_url))
    config = _config(tmp_path, database_url)

    dry = prune(config, "--before", "2025-02-01", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout == (
        f"would remove {SUMMARY} (events received, and bodies last seen, before "
        "2025-02-01T00:00:00+00:00)\n"
    )
    assert dry.stderr == ""
    assert asyncio.run(_left(database_url)) == stored

    done = prune(config, "--before", "2025-02-01")
    assert done.exit_code == 0, done.output
    assert done.stdout == dry.stdout.replace("would remove", "removed")
    after = asyncio.run(_left(database_url))
    assert len(after.events) == len(stored.events) - 2
    assert len(after.deliveries) == len(stored.deliveries) - 2
    assert sum(after.attempts.values()) == sum(stored.attempts.values()) - 4

    again = prune(config, "--before", "2025-02-01")
    assert again.stdout.startswith("removed 0 events, 0 deliveries, 0 attempts and 0 quarantined")


NOTHING = "0 events, 0 deliveries, 0 attempts and 0 quarantined bodies"
UNDELIVERED = "1 event, 0 deliveries, 0 attempts and 1 quarantined body"
"""Before the deliveries ended: the event routed to no destination, and the quarantine."""


@pytest.mark.parametrize(
    ("given", "cutoff", "counts"),
    [
        ("2025-01-10", "2025-01-10T00:00:00+00:00", NOTHING),  # midnight UTC: OLD is not before
        ("20250111", "2025-01-11T00:00:00+00:00", SUMMARY),
        ("2025-01-10T00:30", "2025-01-10T00:30:00+00:00", UNDELIVERED),  # UTC
        ("2025-01-10T03:00:00+02:00", "2025-01-10T01:00:00+00:00", UNDELIVERED),  # as they ended
        ("2025-01-10 02:00:00Z", "2025-01-10T02:00:00+00:00", SUMMARY),
    ],
)
def test_the_cutoff_is_a_date_or_a_time_in_utc_unless_it_has_an_offset(
    tmp_path: Path, given: str, cutoff: str, counts: str
) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    asyncio.run(_seed(url))
    ran = prune(_config(tmp_path, url), "--before", given, "--dry-run")
    assert ran.exit_code == 0, ran.output
    assert ran.stdout == (
        f"would remove {counts} (events received, and bodies last seen, before {cutoff})\n"
    )


def test_a_duration_is_counted_back_from_now() -> None:
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert parse_cutoff("30d", now) == now - timedelta(days=30)
    assert parse_cutoff(" 12h ", now) == now - timedelta(hours=12)
    assert parse_cutoff("0s", now) == now


def test_a_cutoff_the_platform_may_still_retry_is_warned_about(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    stored = asyncio.run(_seed(url))
    config = _config(tmp_path, url)

    recent = prune(config, "--before", "1d")
    old = prune(config, "--before", "15d")

    assert recent.exit_code == 0 and old.exit_code == 0, recent.output + old.output
    [warning] = recent.stderr.splitlines()
    assert warning.startswith("warning: the platform may still send again a callback received")
    assert "stored and relayed again as a new one" in warning
    assert old.stderr == ""
    assert recent.stdout.startswith(f"removed {SUMMARY}")
    assert len(asyncio.run(_left(url)).events) == len(stored.events) - 2


def test_a_big_prune_shows_a_progress_bar_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    asyncio.run(_seed(url))
    config = _config(tmp_path, url)
    monkeypatch.setattr(retention, "BATCH_EVENTS", 1)

    piped = prune(config, "--before", "2025-01-10T12:00", "--dry-run")
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    shown = prune(config, "--before", "2025-01-10T12:00")

    assert piped.exit_code == 0 and shown.exit_code == 0, piped.output + shown.output
    assert piped.stderr == ""
    assert "pruning" in shown.stderr and "1/3" in shown.stderr and "3/3" in shown.stderr
    assert shown.stdout.startswith(f"removed {SUMMARY}")


HOSTILE = [
    pytest.param([], "Missing option '--before'", id="missing"),
    pytest.param(["--before"], "Option '--before' requires an argument", id="no value"),
    pytest.param(["--before", ""], "empty", id="empty"),
    pytest.param(["--before", "  \t"], "empty", id="blank"),
    pytest.param(["--before", "yesterday"], "not a date", id="garbage"),
    pytest.param(["--before", "9" * 100_000], "not a date", id="huge"),
    pytest.param(["--before", "2999-01-01"], "is in the future", id="future"),
    pytest.param(["--before", "1d", "--before", "2d"], "give --before once", id="repeated"),
    pytest.param(["--before", "2025-01-01", "--before", "2025-01-01"], "once", id="same twice"),
    pytest.param(["--before", "2025-13-45"], "not a date", id="no such day"),
    pytest.param(["--before", "30"], "needs its unit", id="no unit"),
    pytest.param(["--before", "-30d"], "not a date", id="negative"),
    pytest.param(["--before", "3651d"], "cannot exceed 3650 days", id="too long ago"),
    pytest.param(["--before", "0001-01-01T00:00+01:00"], "not a date", id="before year 1"),
    pytest.param(["--before", "nan"], "not a date", id="nan"),
    pytest.param(["--before", "2025-01-01\x00"], "not a date", id="nul"),
    pytest.param(["--before", "2025-01-01\udcff"], "not a date", id="bad encoding"),
    pytest.param(["--before", "2025-01-01", "--dry-run=yes"], "does not take a value", id="flag"),
    pytest.param(["--before", "2025-01-01", "extra"], "unexpected extra argument", id="extra"),
]


@pytest.mark.parametrize(("args", "reason"), HOSTILE)
def test_a_hostile_argument_is_a_one_line_usage_error_that_removes_nothing(
    tmp_path: Path, args: list[str], reason: str
) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    stored = asyncio.run(_seed(url))

    ran = prune(_config(tmp_path, url), *args)

    assert ran.exit_code == 2, ran.output
    [error] = [line for line in ran.stderr.splitlines() if line.startswith("Error: ")]
    assert reason in error and len(error) < 200, error
    assert ran.stdout == ""
    assert asyncio.run(_left(url)) == stored


def test_a_store_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    config = _config(tmp_path, f"sqlite:///{tmp_path / 'none.db'}")
    ran = prune(config, "--before", "30d")
    assert ran.exit_code == 1
    assert "there is no database at" in ran.output
    assert not (tmp_path / "none.db").exists()
