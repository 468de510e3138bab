"""`relay events` and `relay rejected`: what the receivers stored and quarantined."""

from __future__ import annotations

import base64
import json
from typing import Any

import click
from sqlalchemy import Row

from receivers.kinds import KINDS_BY_NAME
from receivers.store import ReceivedEvent, RejectedBody, queries
from relay.commands.common import config_option, load_settings_or_exit, run, with_engine


@click.group()
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
    settings = load_settings_or_exit(config_file)
    rows = run(
        with_engine(
            settings,
            lambda e: queries.list_events(
                e, kind=kind, source=source, limit=limit, with_payload=as_json
            ),
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
    settings = load_settings_or_exit(config_file)
    row = run(with_engine(settings, lambda e: queries.get_event(e, event_id)))
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


@click.group()
def rejected() -> None:
    """Inspect quarantined bodies (undecodable or invalid)."""


@rejected.command("list")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def rejected_list(limit: int, as_json: bool, config_file: str | None) -> None:
    """List quarantined bodies, most recently seen first."""
    settings = load_settings_or_exit(config_file)
    rows = run(
        with_engine(settings, lambda e: queries.list_rejected(e, limit=limit, with_body=as_json))
    )
    if as_json:
        click.echo(json.dumps([rejected_json(row) for row in rows], indent=2))
        return
    click.echo(f"{'ID':<36}  {'LAST SEEN (UTC)':<19}  STATUS  COUNT  {'PATH':<28}  REASON")
    for row in rows:
        click.echo(
            f"{row.id:<36}  {row.last_seen_at:%Y-%m-%d %H:%M:%S}  {row.status:>6}  "
            f"{row.count:>5}  {row.path:<28}  {row.reason}"
        )


def event_json(row: ReceivedEvent | Row[Any], *, with_raw: bool = False) -> dict[str, Any]:
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


def rejected_json(row: RejectedBody | Row[Any]) -> dict[str, Any]:
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
