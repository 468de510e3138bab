"""What every `relay` command shares: the --config option, settings, running coroutines."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click
from sqlalchemy.exc import DBAPIError

from receivers.store import StoreFull, create_engine, refusal_of, sqlite_file
from relay import outbox
from relay.destinations.errors import without_credentials
from relay.dispatch.jobs import JobQueue, open_pool
from relay.settings import CONFIG_ENV, Settings, SettingsError, config_path, load_settings
from relay.unknown_variables import option_variables, unknown_variables

T = TypeVar("T")

config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help=(
        "TOML config file (default: $RELAY_CONFIG, else ./relay.toml if there is one; "
        "none: the embedded defaults)."
    ),
)


def load_settings_or_exit(config_file: str | None, *, warn: bool = True) -> Settings:
    """The settings of --config / $RELAY_CONFIG / the environment, or a clean error exit.
    ``warn``: say first on standard error which ``RELAY_*`` variables match nothing (a
    command that logs says it in its log instead, see :func:`unknown_variable_warnings`;
    an error exit says it in any case)."""
    warnings = unknown_variable_warnings()
    if warn:
        echo_warnings(warnings)
    try:
        return load_settings(config_path(config_file, os.environ))
    except SettingsError as exc:
        if not warn:
            echo_warnings(warnings)
        raise click.ClickException(str(exc)) from None


def echo_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def unknown_variable_warnings(environ: Mapping[str, str] = os.environ) -> list[str]:
    """A warning per ``RELAY_*`` variable that matches no setting and no option of any
    ``relay`` command (:mod:`relay.unknown_variables`)."""
    context = click.get_current_context(silent=True)
    root = context.find_root().command if context is not None else None
    options = option_variables(_params(root)) | {CONFIG_ENV} if root else {CONFIG_ENV}
    return unknown_variables(environ, Settings.model_fields, options)


def _params(command: click.Command | None) -> Iterator[click.Parameter]:
    if command is None:
        return
    yield from command.params
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _params(sub)


def run(
    coroutine: Coroutine[Any, Any, T],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """Run a coroutine for a command; configuration and connection errors, and a full store,
    exit cleanly."""
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(coroutine)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach the database: {exc}") from None
    except DBAPIError as exc:
        refusal = refusal_of(exc)
        if not isinstance(refusal, StoreFull):
            raise
        raise click.ClickException(f"the store is full and refuses writes: {refusal}") from None


async def with_engine(
    settings: Settings, action: Any, *, create: bool = False, migrated: bool = True
) -> Any:
    """Run ``action(engine)`` on a fresh engine for the configured database, once it is known
    to be reachable (else a clean error, see :func:`relay.server.runtime.connect_database`). A
    SQLite file that does not exist is an error unless ``create``: connecting would leave an empty
    one behind; a schema behind this version's is an error while ``migrated``."""
    from relay.server.runtime import connect_database, require_current_schema

    engine = create_engine(settings.database_url)
    try:
        database = sqlite_file(engine)
        if not create and database is not None and not Path(database).is_file():
            raise SettingsError(
                f"there is no database at {database}: `relay serve` or `relay db upgrade` "
                "creates it"
            )
        await connect_database(engine)
        if migrated:
            await require_current_schema(engine)
        return await action(engine)
    finally:
        await engine.dispose()


async def enqueue(settings: Settings, due: list[outbox.Due]) -> None:
    """Enqueue on real Redis; in embedded mode the running server's sweeper picks them up, and
    so do the workers' sweepers when Redis cannot be reached (a warning says so): what is due
    is in the database already."""
    if not settings.redis_url or not due:
        return
    try:
        pool = await open_pool(settings.redis_url)
    except SettingsError as exc:
        _enqueue_later(settings, str(exc))
        return
    queue = JobQueue(pool)
    try:
        await queue.enqueue(due)
    finally:
        await queue.connection.aclose()
        await pool.aclose()
    if not queue.connection.connected:
        where = without_credentials(settings.redis_url)
        _enqueue_later(settings, f"Redis at {where} was lost: {queue.connection.reason}")


def _enqueue_later(settings: Settings, why: str) -> None:
    click.echo(
        f"warning: {why}; the workers' sweepers enqueue them when it is back "
        f"(every {settings.sweep_interval.total_seconds():g} s)",
        err=True,
    )


def pickup_note(settings: Settings) -> str:
    """How replayed or released deliveries get picked up in this mode."""
    if settings.redis_url:
        return ""
    return (
        f" (embedded mode: the running `relay serve` picks them up within "
        f"{settings.sweep_interval.total_seconds():g} s)"
    )
