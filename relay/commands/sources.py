"""`relay sources`: the served sources, and retiring the default source's generated token."""

from __future__ import annotations

import json
from typing import Any

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import DEFAULT_SOURCE
from receivers.config import source_prefix
from receivers.kinds import kinds_by_path
from receivers.sources import SourceConfig
from relay.commands.common import config_option, load_settings_or_exit, run, with_engine
from relay.commands.tables import echo_table
from relay.destinations.errors import without_credentials
from relay.server.bootstrap import forget_token, kept_token
from relay.server.default_source import ServedSources, TokenUse, served_sources
from relay.settings import Settings


@click.group()
def sources() -> None:
    """The sources served, and the default source's generated token."""


@sources.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@config_option
def sources_list(as_json: bool, config_file: str | None) -> None:
    """List the sources `relay serve` serves: URL prefix and checks, never a secret."""
    settings = load_settings_or_exit(config_file)

    async def resolve(engine: AsyncEngine) -> ServedSources:
        return await served_sources(settings.sources, engine, generate=False)

    served = run(with_engine(settings, resolve))
    rows = [source_row(name, source, served) for name, source in served.sources.items()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(
            "No source is configured and no token is generated yet: the next `relay serve` "
            "generates one for the default source."
        )
        return
    echo_table(
        ["SOURCE", "PREFIX", "CHECKS"],
        ([row["name"], row["prefix"], "; ".join(row["checks"])] for row in rows),
    )
    if served.generated is not None and served.generated.use is TokenUse.RETIRED:
        click.echo()
        click.echo(
            "The default source's generated token is kept in the database but retired "
            "([sources.default] is configured): `relay sources forget-default` deletes it."
        )
    elif served.generated is not None and served.generated.use is TokenUse.BESIDE_CONFIGURED:
        click.echo()
        click.echo(
            "The default source is served with its generated token because [sources.default] is "
            "not configured: configure it, or run `relay sources forget-default` to retire it."
        )


def source_row(name: str, source: SourceConfig, served: ServedSources) -> dict[str, Any]:
    """What `relay sources list` shows of one source (no secret)."""
    generated = served.generated if name == DEFAULT_SOURCE else None
    prefix = source_prefix(name)
    return {
        "name": name,
        "prefix": prefix,
        "paths": [prefix + path for path in kinds_by_path()],
        "checks": check_names(source, generated_token=generated is not None and generated.served),
        "generated_token": None if generated is None else generated.use.value,
    }


def check_names(source: SourceConfig, *, generated_token: bool = False) -> list[str]:
    """The checks a source's callbacks must pass, named without their secrets."""
    checks = []
    if source.allow_ips:
        checks.append(f"allow_ips {', '.join(str(network) for network in source.allow_ips)}")
    if generated_token:
        checks.append("token (generated, kept in the database)")
    elif source.token:
        checks.append(_counted("token", len(source.token)))
    if source.basic_auth:
        checks.append(_counted("basic_auth", len(source.basic_auth)))
    if source.header is not None:
        checks.append(f"header {source.header.name}")
    if source.signature_secret:
        signature = _counted("signature_secret", len(source.signature_secret))
        checks.append(
            f"{signature} {source.signature_method}, {source.signature_tolerance_seconds} s"
        )
    return checks or ["none (allow_anonymous)"]


def _counted(check: str, secrets: int) -> str:
    return check if secrets == 1 else f"{check} (any of {secrets})"


@sources.command("forget-default")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@config_option
def sources_forget_default(yes: bool, config_file: str | None) -> None:
    """Delete the default source's generated token from the database."""
    settings = load_settings_or_exit(config_file)
    database = without_credentials(settings.database_url)
    nothing = f"Nothing to forget: the database at {database} keeps no generated token."
    if run(with_engine(settings, kept_token)) is None:
        click.echo(nothing)
        return
    outcome = forgetting_outcome(settings)
    if not yes:
        click.echo(f"The database at {database} keeps the default source's generated token.")
        click.echo(outcome)
        confirm("Forget it?")
    if not run(with_engine(settings, forget_token)):  # deleted meanwhile
        click.echo(nothing)
        return
    click.echo(f"Forgot the default source's generated token (database at {database}).")
    if yes:
        click.echo(outcome)


def confirm(question: str) -> None:
    """Go on only on a yes; anything else (no answer, an answer that is not text in the
    terminal's encoding) stops the command with status 1."""
    try:
        click.confirm(question, abort=True)
    except UnicodeDecodeError:
        raise click.ClickException("the answer is not readable text: nothing was changed") from None


def forgetting_outcome(settings: Settings) -> str:
    """What forgetting the generated token changes for the platform's callbacks, with these
    settings."""
    if DEFAULT_SOURCE in settings.sources:
        return (
            "[sources.default] is configured and decides what the default source accepts: "
            "nothing changes for callers."
        )
    if settings.sources:
        return (
            "As each `relay serve` restarts, the default source stops being served: its "
            "URLs (/hooks/...) answer 404. Until then, running servers still accept the token."
        )
    return (
        "No source is configured: the next `relay serve` generates a new token and prints new "
        "URLs; as each `relay serve` restarts, URLs with the old token answer 401."
    )
