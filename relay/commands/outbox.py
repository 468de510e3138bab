"""`relay deliveries` and `relay destinations`: the outbox for operators."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from relay import outbox
from relay.commands.common import (
    config_option,
    enqueue,
    load_settings_or_exit,
    pickup_note,
    run,
    with_engine,
)
from relay.dispatch.jobs import open_pool
from relay.observe.progress import Bar
from relay.outbox.tables import DELIVERY_STATUSES
from relay.settings import Settings, SettingsError
from relay.store import inspect

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
    click.echo(f"{'ID':<36}  {'DESTINATION':<14}  {'STATUS':<9}  TRIES  {'NEXT ATTEMPT':<25}  LAST")
    for row in rows:
        last = row["last_status_code"] or row["last_error"] or ""
        click.echo(
            f"{row['id']:<36}  {row['destination']:<14}  {row['status']:<9}  "
            f"{row['attempts']:>5}  {row['next_attempt_at'] or '-':<25}  {last}"
        )


@deliveries.command("show")
@click.argument("delivery_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@config_option
def deliveries_show(delivery_id: str, as_json: bool, config_file: str | None) -> None:
    """Show one delivery with its attempts (the first 3 and the last 20 are kept)."""
    settings = load_settings_or_exit(config_file)
    document = run(with_engine(settings, lambda e: inspect.get_delivery(e, delivery_id)))
    if document is None:
        raise click.ClickException(f"no delivery {delivery_id}")
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    for key, value in document.items():
        if key != "attempt_log":
            click.echo(f"{key + ':':<18} {value}")
    click.echo("attempts:")
    for attempt in document["attempt_log"]:
        outcome = attempt["status_code"] or attempt["error"]
        click.echo(
            f"  #{attempt['number']:<5} {attempt['started_at']}  "
            f"{attempt['duration_ms']:>9.1f} ms  {outcome}"
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
    wanted = len(set(delivery_ids))
    if delivery_ids and count < wanted:
        raise click.ClickException(f"replayed {count} of {wanted}: unknown ids")
    click.echo(f"replayed {count} deliveries{pickup_note(settings)}")


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
    click.echo(f"{'NAME':<16}  {'TYPE':<12}  FAILURES  {'PAUSED UNTIL':<32}  DISABLED  TARGET")
    for row in rows:
        click.echo(
            f"{row['name']:<16}  {row['type'] or '-':<12}  {row['consecutive_failures']:>8}  "
            f"{row['paused_until'] or '-':<32}  "
            f"{row['disabled_reason'] or 'yes' if row['disabled'] else 'no':<8}  "
            f"{row['target'] or '(not configured)'}"
        )


@destinations.command("enable")
@click.argument("name")
@config_option
def destinations_enable(name: str, config_file: str | None) -> None:
    """Enable a destination after a 410 (also clears its breaker) and release held deliveries."""
    settings = load_settings_or_exit(config_file)
    if name not in settings.destinations:
        raise click.ClickException(f"no destination {name!r} is configured")

    async def enable(engine: AsyncEngine) -> int:
        due = await outbox.enable_destination(engine, name, datetime.now(UTC))
        await enqueue_with_progress(settings, due)
        return len(due)

    count = run(with_engine(settings, enable))
    click.echo(f"enabled {name}; {count} held deliveries released{pickup_note(settings)}")


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
