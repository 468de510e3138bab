"""The `relay` command line."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from receivers.kinds import KINDS_BY_NAME
from receivers.store import queries
from receivers.store.engine import create_engine
from receivers.store.tables import ReceivedEvent, RejectedBody
from relay import migrate
from relay.settings import Settings, SettingsError, config_path, load_settings

T = TypeVar("T")

config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML config file (default: $RELAY_CONFIG; none = embedded defaults).",
)


def _settings(config_file: str | None) -> Settings:
    try:
        return load_settings(config_path(config_file, os.environ))
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coroutine)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot reach the database: {exc}") from None


@click.group()
@click.version_option(package_name="callback-relay")
def main() -> None:
    """callback-relay: receive the platform's callbacks, store them, relay them."""


@main.command()
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
    type=int,
    envvar=["RELAY_PORT", "PORT"],
    help="Port to listen on ($RELAY_PORT or $PORT).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@config_option
def serve(host: str, port: int, log_level: str, config_file: str | None) -> None:
    """Run the receivers (and the embedded relay worker) with uvicorn."""
    from relay.serve import serve as run_server

    _run(run_server(_settings(config_file), host, port, log_level))


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@config_option
def db_upgrade(config_file: str | None) -> None:
    """Apply every pending migration."""
    settings = _settings(config_file)

    async def upgrade() -> str | None:
        engine = create_engine(settings.database_url)
        try:
            await migrate.upgrade(engine)
            return await migrate.current_revision(engine)
        finally:
            await engine.dispose()

    click.echo(f"database at revision {_run(upgrade())}")


@db.command("current")
@config_option
def db_current(config_file: str | None) -> None:
    """Show the database's schema revision and the one this version needs."""
    settings = _settings(config_file)

    async def current() -> str | None:
        engine = create_engine(settings.database_url)
        try:
            return await migrate.current_revision(engine)
        finally:
            await engine.dispose()

    click.echo(
        f"database: {_run(current()) or 'empty'}; this version needs: {migrate.head_revision()}"
    )


@main.group()
def events() -> None:
    """Inspect received events."""


@events.command("list")
@click.option("--kind", type=click.Choice(sorted(KINDS_BY_NAME)), help="Only this kind.")
@click.option("--source", help="Only this source.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def events_list(
    kind: str | None, source: str | None, limit: int, as_json: bool, config_file: str | None
) -> None:
    """List received events, newest first."""
    settings = _settings(config_file)
    rows = _run(
        _with_engine(
            settings, lambda e: queries.list_events(e, kind=kind, source=source, limit=limit)
        )
    )
    if as_json:
        click.echo(json.dumps([event_json(row) for row in rows], indent=2))
        return
    click.echo(f"{'ID':<36}  {'RECEIVED (UTC)':<19}  {'SOURCE':<10}  {'KIND':<21}  DUPS  KEY")
    for row in rows:
        click.echo(
            f"{row.id:<36}  {row.received_at:%Y-%m-%d %H:%M:%S}  {row.source:<10}  "
            f"{row.kind:<21}  {row.duplicates:>4}  {row.dedup_key}"
        )


@events.command("show")
@click.argument("event_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@config_option
def events_show(event_id: str, as_json: bool, config_file: str | None) -> None:
    """Show one event with its payload and raw body."""
    settings = _settings(config_file)
    row = _run(_with_engine(settings, lambda e: queries.get_event(e, event_id)))
    if row is None:
        raise click.ClickException(f"no event {event_id}")
    document = event_json(row, with_raw=True)
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    for key, value in document.items():
        if key != "payload":
            click.echo(f"{key + ':':<14} {value}")
    click.echo("payload:")
    click.echo(json.dumps(row.payload, indent=2, ensure_ascii=False))


@main.group()
def rejected() -> None:
    """Inspect quarantined bodies (undecodable or invalid)."""


@rejected.command("list")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def rejected_list(limit: int, as_json: bool, config_file: str | None) -> None:
    """List quarantined bodies, most recently seen first."""
    settings = _settings(config_file)
    rows = _run(_with_engine(settings, lambda e: queries.list_rejected(e, limit=limit)))
    if as_json:
        click.echo(json.dumps([rejected_json(row) for row in rows], indent=2))
        return
    click.echo(f"{'ID':<36}  {'LAST SEEN (UTC)':<19}  STATUS  COUNT  {'PATH':<28}  REASON")
    for row in rows:
        click.echo(
            f"{row.id:<36}  {row.last_seen_at:%Y-%m-%d %H:%M:%S}  {row.status:>6}  "
            f"{row.count:>5}  {row.path:<28}  {row.reason}"
        )


async def _with_engine(settings: Settings, action: Any) -> Any:
    engine = create_engine(settings.database_url)
    try:
        return await action(engine)
    finally:
        await engine.dispose()


def event_json(row: ReceivedEvent, *, with_raw: bool = False) -> dict[str, Any]:
    """An event as JSON for operators."""
    document: dict[str, Any] = {
        "id": row.id,
        "source": row.source,
        "kind": row.kind,
        "dedup_key": row.dedup_key,
        "received_at": row.received_at.isoformat(),
        "duplicates": row.duplicates,
        "method": row.method,
        "content_type": row.content_type,
        "remote_addr": row.remote_addr,
        "payload": row.payload,
    }
    if with_raw:
        document.update(_raw(row.raw_body))
    return document


def rejected_json(row: RejectedBody) -> dict[str, Any]:
    """A quarantined body as JSON for operators."""
    return {
        "id": row.id,
        "source": row.source,
        "path": row.path,
        "kind": row.kind,
        "status": row.status,
        "reason": row.reason,
        "errors": row.errors,
        "body_hash": row.body_hash,
        "count": row.count,
        "received_at": row.received_at.isoformat(),
        "last_seen_at": row.last_seen_at.isoformat(),
        "content_type": row.content_type,
        "remote_addr": row.remote_addr,
        **_raw(row.raw_body),
    }


def _raw(raw: bytes) -> dict[str, str]:
    try:
        return {"raw_body": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"raw_body_base64": base64.b64encode(raw).decode()}
