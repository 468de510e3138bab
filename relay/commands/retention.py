"""`relay store prune`: remove old events and quarantined bodies now, as ``retention`` does."""

from __future__ import annotations

from datetime import UTC, datetime

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from relay.commands.common import config_option, load_settings_or_exit, run, with_engine
from relay.durations import PATTERN, parse_duration
from relay.observe.progress import Bar
from relay.store import retention
from relay.store.retention import Pruned

LONGEST_CUTOFF_TEXT = 64
"""No date, time or duration needs more characters; a longer value is refused unread."""
SHOWN = 40
"""How much of a refused value its error message repeats."""


def parse_cutoff(text: str, now: datetime) -> datetime:
    """The moment ``--before`` names: an ISO 8601 date (midnight UTC) or date and time (UTC
    unless it has an offset), or a duration with its unit (``30d``: that long before ``now``).
    ValueError for anything else, or a moment after ``now``."""
    given = text.strip()
    shown = repr(text if len(text) <= SHOWN else text[:SHOWN] + "...")
    if not given:
        raise ValueError("empty: give a date (2026-01-31), a UTC time or a duration (30d)")
    if len(given) > LONGEST_CUTOFF_TEXT:
        raise ValueError(f"not a date, a time or a duration: {shown}")
    duration = PATTERN.match(given)
    if duration and duration.group(2):
        return now - parse_duration(given)
    try:
        moment = datetime.fromisoformat(given)
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        if duration:
            raise ValueError(f"a duration needs its unit (30d, 12h): {shown}") from None
        raise ValueError(
            f"not a date (2026-01-31), a UTC time (2026-01-31T12:00) or a duration (30d): {shown}"
        ) from None
    if moment > now:
        raise ValueError(f"{moment.isoformat()} is in the future")
    return moment


@click.group()
def store() -> None:
    """Manage the store's size."""


@store.command("prune")
@click.option(
    "--before",
    multiple=True,
    required=True,
    metavar="DATE",
    help=(
        "Remove what is older: a date (2026-01-31, midnight UTC), a time (2026-01-31T12:00, "
        "UTC unless it has an offset) or a duration before now (30d)."
    ),
)
@click.option("--dry-run", is_flag=True, help="Count what would go; remove nothing.")
@config_option
def store_prune(before: tuple[str, ...], dry_run: bool, config_file: str | None) -> None:
    """Remove events received before DATE whose deliveries are all final (succeeded or dead),
    with their deliveries and attempts, and quarantined bodies last seen before DATE. Nothing
    pending, held or not yet routed goes."""
    if len(before) > 1:
        raise click.UsageError("give --before once")
    now = datetime.now(UTC)
    try:
        cutoff = parse_cutoff(before[0], now)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--before'") from None
    settings = load_settings_or_exit(config_file)
    retried_since = now - retention.platform_retry_window()
    if cutoff > retried_since:
        click.echo(
            f"warning: the platform may still send again a callback received after "
            f"{retried_since.isoformat(timespec='seconds')}; a retry of a removed event is "
            "stored and relayed again as a new one",
            err=True,
        )

    async def prune(engine: AsyncEngine) -> Pruned:
        counted = await retention.count_prunable(engine, cutoff)
        if dry_run or not counted:
            return counted
        with Bar("pruning", counted.rows) as bar:
            return await retention.prune(
                engine,
                cutoff,
                progress=lambda done: bar.update(done.rows, max(counted.rows, done.rows)),
            )

    pruned = run(with_engine(settings, prune))
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{verb} {pruned.describe()} (events received, and bodies last seen, before "
        f"{cutoff.isoformat()})"
    )
