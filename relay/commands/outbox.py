"""`relay deliveries` and `relay destinations`: the outbox for operators."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import ID_FORMAT
from relay import outbox
from relay.commands.action_log import ActionLog, os_user
from relay.commands.common import (
    config_option,
    enqueue,
    load_settings_or_exit,
    pickup_note,
    run,
    with_engine,
)
from relay.commands.escape import shown
from relay.commands.tables import echo_fields, echo_table, moment
from relay.console.wording import attempt_outcome
from relay.dispatch.jobs import open_pool
from relay.observe.operator_actions import (
    COMMAND_LINE,
    enabled,
    filter_text,
    ids_text,
    replayed,
)
from relay.observe.progress import Bar
from relay.outbox.records import KEEP_FIRST_ATTEMPTS, KEEP_LAST_ATTEMPTS
from relay.outbox.tables import DELIVERY_STATUSES
from relay.settings import Settings, SettingsError
from relay.store import inspect
from relay.words import counted

ENQUEUE_BATCH = 1000
"""How many deliveries one step of the enqueueing bar enqueues."""


@click.group()
def deliveries() -> None:
    """Inspect and replay deliveries (one per event and destination)."""


@deliveries.command("list")
@click.option("--status", type=click.Choice(DELIVERY_STATUSES), help="Only this status.")
@click.option("--destination", help="Only this destination.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def deliveries_list(
    status: str | None, destination: str | None, limit: int, as_json: bool, config_file: str | None
) -> None:
    """List deliveries, newest first."""
    settings = load_settings_or_exit(config_file)
    rows = run(
        with_engine(
            settings,
            lambda e: inspect.list_deliveries(
                e, status=status, destination=destination, limit=limit
            ),
        )
    )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    echo_table(
        ["ID", "DESTINATION", "STATUS", "ATTEMPTS", "NEXT ATTEMPT (UTC)", "LAST"],
        (
            [
                row["id"],
                row["destination"],
                row["status"],
                row["attempts"],
                next_attempt(row),
                last_outcome(row["last_status_code"], row["last_error"]),
            ]
            for row in rows
        ),
    )


WAITING_IN_LINE = "waiting in line"
"""The next attempt of a pending delivery whose key's line has an earlier delivery to go first
(its due time may be past: it goes when those before it are done)."""


def next_attempt(row: dict[str, Any]) -> str | None:
    """A delivery's NEXT ATTEMPT cell: its due time, or :data:`WAITING_IN_LINE`."""
    return WAITING_IN_LINE if row.get("waiting_in_line") else moment(row["next_attempt_at"])


def last_outcome(status_code: int | None, error: str | None) -> str | None:
    """What an attempt ended with, in a cell: ``HTTP 503``, or its error."""
    return f"HTTP {status_code}" if status_code is not None else error


def attempt_cell(status_code: int | None, error: str | None) -> str:
    """An attempt's OUTCOME cell: ``HTTP 200``, its error, or (a broker's publish, which has
    no HTTP status) "delivered" as the console words it."""
    return last_outcome(status_code, error) or attempt_outcome(status_code, error)


@deliveries.command("show")
@click.argument("delivery_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@config_option
def deliveries_show(delivery_id: str, as_json: bool, config_file: str | None) -> None:
    """Show one delivery with its attempts (the first 3 and the last 20 are kept)."""
    settings = load_settings_or_exit(config_file)
    wanted = delivery_id.lower()

    async def lookup(engine: AsyncEngine) -> dict[str, Any] | None:
        if not ID_FORMAT.fullmatch(wanted):  # unknown, unasked: PostgreSQL refuses a NUL
            return None
        return await inspect.get_delivery(engine, wanted)

    document = run(with_engine(settings, lookup))
    if document is None:
        raise click.ClickException(f"no delivery {shown(delivery_id)}")
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    echo_fields((key, value) for key, value in document.items() if key != "attempt_log")
    kept = document["attempt_log"]
    click.echo()
    click.echo(f"attempt log: {kept_attempts(document['attempts'], len(kept))}")
    if kept:
        echo_table(
            ["#", "STARTED (UTC)", "DURATION", "OUTCOME"],
            (
                [
                    attempt["number"],
                    moment(attempt["started_at"], milliseconds=True),
                    f"{attempt['duration_ms']:.1f} ms",
                    attempt_cell(attempt["status_code"], attempt["error"]),
                ]
                for attempt in kept
            ),
        )


def kept_attempts(attempts: int, kept: int) -> str:
    """``1 attempt``, ``25 attempts, 23 kept (the first 3 and the last 20)``."""
    if kept == attempts:
        return counted(attempts, "attempt")
    return (
        f"{counted(attempts, 'attempt')}, {kept} kept (the first {KEEP_FIRST_ATTEMPTS} and "
        f"the last {KEEP_LAST_ATTEMPTS})"
    )


@deliveries.command("replay")
@click.argument("delivery_ids", nargs=-1)
@click.option(
    "--status",
    type=click.Choice(DELIVERY_STATUSES),
    help="Replay every delivery in this status (e.g. dead).",
)
@click.option("--destination", help="Only deliveries to this destination.")
@click.option(
    "--since",
    type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    help="Only deliveries created at or after this UTC time.",
)
@config_option
def deliveries_replay(
    delivery_ids: tuple[str, ...],
    status: str | None,
    destination: str | None,
    since: datetime | None,
    config_file: str | None,
) -> None:
    """Put deliveries back on a fresh schedule, due now."""
    if not delivery_ids and status is None:
        raise click.UsageError("give delivery ids, or --status (e.g. --status dead)")
    settings = load_settings_or_exit(config_file)
    action_log = ActionLog.of(settings)
    since_utc = since.replace(tzinfo=UTC) if since else None

    async def replay(engine: AsyncEngine) -> int:
        with Bar("replaying") as bar:
            due = await outbox.replay(
                engine,
                datetime.now(UTC),
                delivery_ids=delivery_ids,
                status=status,
                destination=destination,
                since=since_utc,
                progress=bar.update,
            )
        await enqueue_with_progress(settings, due)
        return len(due)

    count = run(with_engine(settings, replay))
    who = os_user()
    which = replay_choice(delivery_ids, status, destination, since)
    action_log.write(
        replayed(COMMAND_LINE, who, count, which, status=status),
        who,
        destination=shown(destination) if destination else None,
    )
    wanted = len(set(delivery_ids))
    if delivery_ids and count < wanted:
        raise click.ClickException(f"replayed {count} of {wanted}: unknown ids")
    click.echo(f"replayed {counted(count, 'delivery')}{pickup_note(settings)}")


def replay_choice(
    ids: tuple[str, ...], status: str | None, destination: str | None, since: datetime | None
) -> str:
    """How a replay chose its deliveries, for its log line: the ids (the first few), and the
    filter as the console writes it (``status=dead&destination=crm``); what the user typed is
    escaped (a line stays one line)."""
    given = {
        "status": status,
        "destination": destination,
        "since": since.strftime("%Y-%m-%dT%H:%M:%S") if since else None,
    }
    parts = [ids_text([shown(i) for i in dict.fromkeys(ids)])] if ids else []
    if any(given.values()):
        parts.append(filter_text(given))
    return "; ".join(parts) or filter_text(given)


@click.group()
def destinations() -> None:
    """Destination health: breaker state and the 410 switch."""


@destinations.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def destinations_list(as_json: bool, config_file: str | None) -> None:
    """List destinations with consecutive failures, pause and disabled state."""
    settings = load_settings_or_exit(config_file)
    rows = run(
        with_engine(settings, lambda e: inspect.list_destinations(e, list(settings.destinations)))
    )
    for row in rows:
        config = settings.destinations.get(row["name"])
        row["type"] = config.type if config else None
        row["target"] = config.target() if config else None
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    echo_table(
        ["NAME", "TYPE", "FAILURES", "PAUSED UNTIL (UTC)", "DISABLED", "TARGET"],
        (
            [
                row["name"],
                row["type"],
                row["consecutive_failures"],
                moment(row["paused_until"]),
                (row["disabled_reason"] or "yes") if row["disabled"] else "no",
                row["target"] or "(not configured)",
            ]
            for row in rows
        ),
    )


@destinations.command("enable")
@click.argument("name")
@config_option
def destinations_enable(name: str, config_file: str | None) -> None:
    """Enable a destination after a 410 (also clears its breaker) and release held deliveries."""
    settings = load_settings_or_exit(config_file)
    if name not in settings.destinations:
        raise click.ClickException(f"no destination {name!r} is configured")

    action_log = ActionLog.of(settings)

    async def enable(engine: AsyncEngine) -> int:
        due = await outbox.enable_destination(engine, name, datetime.now(UTC))
        await enqueue_with_progress(settings, due)
        return len(due)

    count = run(with_engine(settings, enable))
    action_log.write(enabled(COMMAND_LINE, os_user(), name, count), os_user(), destination=name)
    released = counted(count, "held delivery", "held deliveries")
    click.echo(f"enabled {name}; {released} released{pickup_note(settings)}")


async def enqueue_with_progress(settings: Settings, due: list[outbox.Due]) -> None:
    """:func:`enqueue` these deliveries: at once, or :data:`ENQUEUE_BATCH` at a time under a
    progress bar when there are more than that and Redis answers (a Redis that does not gets
    :func:`enqueue`'s warning, once)."""
    url = settings.redis_url
    if url is None or len(due) <= ENQUEUE_BATCH or not await _answers(url):
        await enqueue(settings, due)
        return
    with Bar("enqueueing", len(due)) as bar:
        for start in range(0, len(due), ENQUEUE_BATCH):
            batch = due[start : start + ENQUEUE_BATCH]
            await enqueue(settings, batch)
            bar.advance(len(batch))


async def _answers(redis_url: str) -> bool:
    """Whether the relay queue's Redis can be reached now."""
    try:
        pool = await open_pool(redis_url)
    except SettingsError:
        return False
    await pool.aclose()
    return True
