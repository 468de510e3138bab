"""The `relay` command line."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.kinds import KINDS_BY_NAME
from receivers.store import queries
from receivers.store.engine import create_engine
from receivers.store.tables import ReceivedEvent, RejectedBody
from relay import inspect, migrate, outbox
from relay.jobs import JobQueue
from relay.settings import Settings, SettingsError, config_path, load_settings
from relay.tables import DELIVERY_STATUSES

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


def _run(
    coroutine: Coroutine[Any, Any, T],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(coroutine)
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
@click.option(
    "--access-log/--no-access-log", default=True, show_default=True, help="Log every request."
)
@config_option
def serve(host: str, port: int, log_level: str, access_log: bool, config_file: str | None) -> None:
    """Run the receivers (and the embedded relay worker) with uvicorn."""
    from relay.serve import event_loop_factory
    from relay.serve import serve as run_server

    settings = _settings(config_file)
    _run(
        run_server(settings, host, port, log_level, access_log=access_log),
        loop_factory=event_loop_factory(),
    )


@main.command()
@config_option
def worker(config_file: str | None) -> None:
    """Run a relay worker (and its sweeper) on the configured Redis."""
    from relay.runtime import run_worker

    _run(run_worker(_settings(config_file)))


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


@main.group()
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
    settings = _settings(config_file)
    rows = _run(
        _with_engine(
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
    settings = _settings(config_file)
    document = _run(_with_engine(settings, lambda e: inspect.get_delivery(e, delivery_id)))
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
    settings = _settings(config_file)
    since_utc = since.replace(tzinfo=UTC) if since else None

    async def replay(engine: AsyncEngine) -> int:
        due = await outbox.replay(
            engine,
            datetime.now(UTC),
            delivery_ids=delivery_ids,
            status=status,
            destination=destination,
            since=since_utc,
        )
        await _enqueue(settings, due)
        return len(due)

    count = _run(_with_engine(settings, replay))
    if delivery_ids and count < len(delivery_ids):
        raise click.ClickException(f"replayed {count} of {len(delivery_ids)}: unknown ids")
    click.echo(f"replayed {count} deliveries{_pickup_note(settings)}")


@main.group()
def destinations() -> None:
    """Destination health: breaker state and the 410 switch."""


@destinations.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def destinations_list(as_json: bool, config_file: str | None) -> None:
    """List destinations with consecutive failures, pause and disabled state."""
    settings = _settings(config_file)
    rows = _run(
        _with_engine(settings, lambda e: inspect.list_destinations(e, list(settings.destinations)))
    )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'NAME':<16}  FAILURES  {'PAUSED UNTIL':<32}  DISABLED")
    for row in rows:
        click.echo(
            f"{row['name']:<16}  {row['consecutive_failures']:>8}  "
            f"{row['paused_until'] or '-':<32}  "
            f"{row['disabled_reason'] or 'yes' if row['disabled'] else 'no'}"
        )


@destinations.command("enable")
@click.argument("name")
@config_option
def destinations_enable(name: str, config_file: str | None) -> None:
    """Enable a destination after a 410 (also clears its breaker) and release held deliveries."""
    settings = _settings(config_file)
    if name not in settings.destinations:
        raise click.ClickException(f"no destination {name!r} is configured")

    async def enable(engine: AsyncEngine) -> int:
        due = await outbox.enable_destination(engine, name, datetime.now(UTC))
        await _enqueue(settings, due)
        return len(due)

    count = _run(_with_engine(settings, enable))
    click.echo(f"enabled {name}; {count} held deliveries released{_pickup_note(settings)}")


async def _enqueue(settings: Settings, due: list[outbox.Due]) -> None:
    """Enqueue on real Redis; in embedded mode the running server's sweeper picks them up."""
    if not settings.redis_url or not due:
        return
    from arq.connections import RedisSettings, create_pool

    pool = await create_pool(RedisSettings.from_dsn(settings.redis_url))
    try:
        await JobQueue(pool).enqueue(due)
    finally:
        await pool.aclose()


def _pickup_note(settings: Settings) -> str:
    if settings.redis_url:
        return ""
    return (
        f" (embedded mode: the running `relay serve` picks them up within "
        f"{settings.sweep_interval.total_seconds():g} s)"
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
