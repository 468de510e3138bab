"""`relay serve`, `relay worker` and `relay db`: the processes and the schema."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.event_loop import LOOP_NAMES, LoopName, LoopUnavailable, loop_factory
from relay.commands.common import (
    config_option,
    load_settings_or_exit,
    run,
    unknown_variable_warnings,
    with_engine,
)
from relay.observe.known_secrets import known_secrets
from relay.observe.logs import LOG_FORMATS, LOG_LEVELS, LogFormat, configure_logging
from relay.store import migrate

log = logging.getLogger("relay.settings")  # stable: users filter on it

log_level_option = click.option(
    "--log-level",
    default="info",
    show_default=True,
    envvar="RELAY_LOG_LEVEL",
    type=click.Choice(LOG_LEVELS),
    help="Least severe records printed ($RELAY_LOG_LEVEL).",
)
log_format_option = click.option(
    "--log-format",
    default="text",
    show_default=True,
    envvar="RELAY_LOG_FORMAT",
    type=click.Choice(LOG_FORMATS),
    help="text, or json: one JSON object per line ($RELAY_LOG_FORMAT).",
)
loop_option = click.option(
    "--loop",
    default="auto",
    show_default=True,
    envvar="RELAY_LOOP",
    type=click.Choice(LOOP_NAMES),
    help="Event loop: uvloop where it is installed (auto), asyncio's own, or uvloop ($RELAY_LOOP).",
)


def log_unknown_variables() -> None:
    """Warn in the log, once at start, of each ``RELAY_*`` variable that matches nothing."""
    for warning in unknown_variable_warnings():
        log.warning(warning)


def chosen_loop(name: LoopName) -> Callable[[], asyncio.AbstractEventLoop]:
    """The factory of the ``--loop`` asked for; one that is not installed is a clean error."""
    try:
        return loop_factory(name)
    except LoopUnavailable as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="RELAY_HOST",
    help="Interface to listen on ($RELAY_HOST).",
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    envvar=["RELAY_PORT", "PORT"],
    help="Port to listen on; 0: any free port ($RELAY_PORT or $PORT).",
)
@log_level_option
@log_format_option
@click.option(
    "--access-log/--no-access-log", default=True, show_default=True, help="Log every request."
)
@loop_option
@config_option
def serve(
    host: str,
    port: int,
    log_level: str,
    log_format: LogFormat,
    access_log: bool,
    loop: LoopName,
    config_file: str | None,
) -> None:
    """Run the receivers (and the embedded relay worker) with uvicorn."""
    from relay.server.serve import serve as run_server

    new_loop = chosen_loop(loop)
    settings = load_settings_or_exit(config_file, warn=False)
    secrets = known_secrets(settings)
    configure_logging(log_level, log_format, secrets)
    log_unknown_variables()
    try:
        run(
            run_server(settings, host, port, log_level, access_log=access_log, secrets=secrets),
            loop_factory=new_loop,
        )
    except KeyboardInterrupt:  # Ctrl+C: uvicorn stopped gracefully, then raised SIGINT again
        return


@click.command()
@log_level_option
@log_format_option
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    envvar="RELAY_METRICS_PORT",
    help="Serve this worker's Prometheus metrics at /metrics on this port; default: not "
    "served ($RELAY_METRICS_PORT).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="RELAY_METRICS_HOST",
    help="Interface of the metrics port ($RELAY_METRICS_HOST).",
)
@loop_option
@config_option
def worker(
    log_level: str,
    log_format: LogFormat,
    metrics_port: int | None,
    metrics_host: str,
    loop: LoopName,
    config_file: str | None,
) -> None:
    """Run a relay worker (and its sweeper) on the configured Redis."""
    from relay.dispatch.worker import shorten_switch_interval
    from relay.server.runtime import run_worker

    new_loop = chosen_loop(loop)
    settings = load_settings_or_exit(config_file, warn=False)
    configure_logging(log_level, log_format, known_secrets(settings))
    log_unknown_variables()
    shorten_switch_interval()
    run(
        run_worker(settings, metrics_host=metrics_host, metrics_port=metrics_port),
        loop_factory=new_loop,
    )


@click.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@config_option
def db_upgrade(config_file: str | None) -> None:
    """Apply every pending migration."""
    settings = load_settings_or_exit(config_file)

    async def upgrade(engine: AsyncEngine) -> str | None:
        await migrate.upgrade(engine)
        return await migrate.current_revision(engine)

    revision = run(with_engine(settings, upgrade, create=True, migrated=False))
    click.echo(f"database at revision {revision}")


@db.command("current")
@config_option
def db_current(config_file: str | None) -> None:
    """Show the database's schema revision and the one this version needs."""
    settings = load_settings_or_exit(config_file)

    current = run(with_engine(settings, migrate.current_revision, migrated=False))
    click.echo(f"database: {current or 'empty'}; this version needs: {migrate.head_revision()}")
