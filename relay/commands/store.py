"""`relay events` and `relay rejected`: what the receivers stored and quarantined."""

from __future__ import annotations

import base64
import json
from typing import Any

import click
from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.ids import ID_FORMAT
from receivers.kinds import KINDS_BY_NAME, kinds_matching
from receivers.store import ReceivedEvent, RejectedBody, queries
from relay.commands.common import config_option, load_settings_or_exit, run, with_engine
from relay.commands.escape import KEPT, escaped, shown
from relay.commands.tables import echo_fields, echo_table
from relay.words import counted


@click.group()
def events() -> None:
    """Inspect received events."""


def kind_globs(
    ctx: click.Context, param: click.Parameter, patterns: tuple[str, ...]
) -> list[str] | None:
    """The kinds the ``--kind`` globs match (destinations' ``kinds`` read them so), or None
    when none is given; a glob that matches no kind is a usage error naming the kinds."""
    if not patterns:
        return None
    kinds: list[str] = []
    for pattern in patterns:
        matched = kinds_matching(pattern)
        if not matched:
            raise click.BadParameter(
                f"{shown(pattern)!r} matches no kind (known: {', '.join(KINDS_BY_NAME)})",
                ctx=ctx,
                param=param,
            )
        kinds.extend(matched)
    return list(dict.fromkeys(kinds))


@events.command("list")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="GLOB",
    callback=kind_globs,
    help="Only the kinds this glob matches (sms.dlr, sms.*, conversations.*); repeat for more.",
)
@click.option("--source", help="Only this source.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def events_list(
    kinds: list[str] | None,
    source: str | None,
    limit: int,
    as_json: bool,
    config_file: str | None,
) -> None:
    """List received events, newest first."""
    settings = load_settings_or_exit(config_file)
    rows = run(
        with_engine(
            settings,
            lambda e: queries.list_events(
                e, kind=kinds, source=source, limit=limit, with_payload=as_json
            ),
        )
    )
    if as_json:
        click.echo(json.dumps([event_json(row) for row in rows], indent=2))
        return
    echo_table(
        ["ID", "RECEIVED (UTC)", "SOURCE", "KIND", "DUPLICATES", "KEY"],
        (
            [row.id, row.received_at, row.source, row.kind, row.duplicates, row.dedup_key]
            for row in rows
        ),
    )


@events.command("show")
@click.argument("event_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@config_option
def events_show(event_id: str, as_json: bool, config_file: str | None) -> None:
    """Show one event with its payload and raw body."""
    settings = load_settings_or_exit(config_file)
    wanted = event_id.lower()

    async def lookup(engine: AsyncEngine) -> ReceivedEvent | None:
        if not ID_FORMAT.fullmatch(wanted):  # unknown, unasked: PostgreSQL refuses a NUL
            return None
        return await queries.get_event(engine, wanted)

    row = run(with_engine(settings, lookup))
    if row is None:
        raise click.ClickException(f"no event {shown(event_id)}")
    document = event_json(row, with_raw=True)
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    echo_fields((key, value) for key, value in document.items() if key != "payload")
    click.echo("payload:")
    click.echo(escaped(json.dumps(row.payload, indent=2, ensure_ascii=False), keep=KEPT))


@click.group()
def rejected() -> None:
    """Inspect quarantined bodies (undecodable or invalid)."""


@rejected.command("list")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def rejected_list(limit: int, as_json: bool, config_file: str | None) -> None:
    """List quarantined bodies, most recently seen first (`relay rejected show ID` shows one
    with its body)."""
    settings = load_settings_or_exit(config_file)
    rows = run(
        with_engine(settings, lambda e: queries.list_rejected(e, limit=limit, with_body=as_json))
    )
    if as_json:
        click.echo(json.dumps([rejected_json(row) for row in rows], indent=2))
        return
    echo_table(
        ["ID", "LAST SEEN (UTC)", "STATUS", "COUNT", "PATH", "REASON"],
        ([row.id, row.last_seen_at, row.status, row.count, row.path, row.reason] for row in rows),
    )


@rejected.command("show")
@click.argument("rejected_id")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON object: the body as raw_body (UTF-8) or raw_body_base64 (any other bytes).",
)
@config_option
def rejected_show(rejected_id: str, as_json: bool, config_file: str | None) -> None:
    """Show one quarantined body: why it was refused, then its raw body as text, escaped:
    control characters, terminal escapes and bytes that are not UTF-8 are shown as \\x
    escapes (the exact bytes: --json)."""
    settings = load_settings_or_exit(config_file)
    wanted = rejected_id.lower()

    async def lookup(engine: AsyncEngine) -> Row[Any] | None:
        if not ID_FORMAT.fullmatch(wanted):  # unknown, unasked: PostgreSQL refuses a NUL
            return None
        return await queries.get_rejected(engine, wanted)

    row = run(with_engine(settings, lookup))
    if row is None:
        raise click.ClickException(
            f"no quarantined body {shown(rejected_id)} (`relay rejected list` lists them)"
        )
    document = rejected_json(row)
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    fields = {key: value for key, value in document.items() if not key.startswith("raw_body")}
    fields["errors"] = json.dumps(row.errors, ensure_ascii=False) if row.errors else None
    fields["size"] = counted(len(row.raw_body), "byte")
    echo_fields(fields.items())
    click.echo("body:")
    click.echo(escaped(row.raw_body, keep=KEPT))


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
