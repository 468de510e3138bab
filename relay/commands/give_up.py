"""`relay deliveries give-up`: make pending or held deliveries dead now, so their lines move."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import ID_FORMAT
from relay.commands.action_log import ActionLog, os_user
from relay.commands.common import (
    config_option,
    load_settings_or_exit,
    pickup_note,
    run,
    with_engine,
)
from relay.commands.outbox import enqueue_with_progress
from relay.delivery.give_up import (
    GIVABLE,
    LONGEST_NAME,
    LONGEST_REASON,
    GivenUp,
    checked_text,
    give_up,
)
from relay.observe import progress
from relay.observe.operator_actions import COMMAND_LINE, gave_up
from relay.outbox import DELIVERIES, LOOKUP_CHUNK
from relay.words import counted

SHOWN_ID = 60
"""How much of a rejected id an error message repeats."""


def delivery_ids(values: tuple[str, ...]) -> list[str]:
    """The ids as given, lower-cased, each once; a value that is not a delivery id (a UUID) is
    a usage error naming it."""
    ids: list[str] = []
    for value in values:
        if not ID_FORMAT.fullmatch(value.lower()):
            shown = value if len(value) <= SHOWN_ID else value[:SHOWN_ID] + "..."
            raise click.BadParameter(
                f"{shown!r} is not a delivery id (a UUID such as those of `relay deliveries list`)",
                param_hint="DELIVERY_IDS",
            )
        ids.append(value.lower())
    return list(dict.fromkeys(ids))


def text_option(value: str | None, name: str, longest: int) -> str | None:
    if value is None:
        return None
    try:
        return checked_text(value, longest)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from None


async def statuses(engine: AsyncEngine, ids: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    async with engine.connect() as conn:
        for start in range(0, len(ids), LOOKUP_CHUNK):
            query = select(DELIVERIES.c.id, DELIVERIES.c.status).where(
                DELIVERIES.c.id.in_(ids[start : start + LOOKUP_CHUNK])
            )
            found.update({row.id: row.status for row in await conn.execute(query)})
    return found


@click.command("give-up")
@click.argument("delivery_ids_given", metavar="DELIVERY_IDS...", nargs=-1, required=True)
@click.option(
    "--reason", help=f"Why, kept in each delivery's last error (at most {LONGEST_REASON} chars)."
)
@click.option("--by", help="Who gives up (default: the user running the command).")
@click.option("--yes", is_flag=True, help="Do not ask (needed without a terminal).")
@config_option
def give_up_command(
    delivery_ids_given: tuple[str, ...],
    reason: str | None,
    by: str | None,
    yes: bool,
    config_file: str | None,
) -> None:
    """Give deliveries up: each pending or held one becomes dead now, without an attempt, and
    the next delivery of its per-key line goes at once. Exit status 0 when every id was given
    up, 1 when some were unknown or already final (they are listed), 2 on a usage error."""
    ids = delivery_ids(delivery_ids_given)
    reason = text_option(reason, "--reason", LONGEST_REASON)
    who = text_option(by, "--by", LONGEST_NAME) if by is not None else os_user()
    if not yes and not progress.is_terminal(sys.stdin):
        raise click.UsageError("no terminal to ask for confirmation: pass --yes")
    settings = load_settings_or_exit(config_file)
    action_log = ActionLog.of(settings)

    async def act(engine: AsyncEngine) -> GivenUp:
        found = await statuses(engine, ids)
        givable = [i for i in ids if found.get(i) in GIVABLE]
        if givable and not yes:
            click.confirm(
                f"Give up {len(givable)} of {counted(len(ids), 'delivery')}? They become dead now "
                "(replay brings them back)",
                abort=True,
                err=True,
            )
        done = await give_up(engine, datetime.now(UTC), ids, by=who, reason=reason)
        await enqueue_with_progress(settings, done.next_in_line)
        return done

    done: GivenUp = run(with_engine(settings, act))
    action_log.write(gave_up(COMMAND_LINE, who, done.given_up, reason), who)
    for delivery_id in done.unknown:
        click.echo(f"not given up: {delivery_id}: no such delivery", err=True)
    for delivery_id, status in done.finished.items():
        click.echo(f"not given up: {delivery_id}: {status} already", err=True)
    moved = len(done.next_in_line)
    line_note = f"; {moved} next in line due now" if moved else ""
    given = counted(len(done.given_up), "delivery")
    click.echo(f"gave up {given}{line_note}{pickup_note(settings)}")
    if done.unknown or done.finished:
        raise SystemExit(1)
