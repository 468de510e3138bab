"""`relay console`: the console's sessions, for operators."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from relay.commands.common import config_option, load_settings_or_exit, run, with_engine
from relay.console.sessions import LOGOUT_ALL, end_sessions
from relay.console.users import could_be_user
from relay.words import counted


@click.group("console")
def console_commands() -> None:
    """The operator console's sessions."""


def _user_names(
    context: click.Context, parameter: click.Parameter, names: tuple[str, ...]
) -> tuple[str, ...]:
    for name in names:
        if not could_be_user(name):
            raise click.BadParameter(
                f"{name[:40]!r} is not a console user name (1-64 letters, digits or . _ @ -)"
            )
    return names


@console_commands.command("logout-all")
@click.option(
    "--user",
    "users",
    multiple=True,
    callback=_user_names,
    help="Only this user's sessions (repeat for several users).",
)
@config_option
def logout_all(users: tuple[str, ...], config_file: str | None) -> None:
    """End every console session (or those of --user) on every replica, at once."""
    settings = load_settings_or_exit(config_file)
    count = run(
        with_engine(
            settings,
            lambda engine: end_sessions(
                engine, datetime.now(UTC), LOGOUT_ALL, users=set(users) or None
            ),
        )
    )
    whose = f" of {', '.join(sorted(set(users)))}" if users else ""
    click.echo(f"ended {counted(count, 'console session')}{whose}")
