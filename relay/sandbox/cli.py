"""`relay sandbox`: serve a local fake of the platform's API; `relay sandbox numbers`: its magic
numbers."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import click
import uvicorn

from relay.sandbox.app import build_app
from relay.sandbox.numbers import ANY_OTHER, NUMBERS
from relay.sandbox.numerals import decimal
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.settings import (
    CHAOS_NAMES,
    MAX_TIME_SCALE,
    MIN_TIME_SCALE,
    SandboxSettingsError,
    load_sandbox_settings,
)

BACKLOG = 2048


def _finite(value: float | None) -> float | None:
    """``--time-scale``: refuse nan (a range check lets it through)."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a number", param_hint="--time-scale")
    return value


def parse_chaos(values: tuple[str, ...]) -> dict[str, float]:
    """``NAME`` (always) or ``NAME=SHARE`` (0 to 1) per value, NAME one of :data:`CHAOS_NAMES`."""
    chaos: dict[str, float] = {}
    for value in values:
        name, sep, share = value.partition("=")
        name = name.strip().lower()
        if name not in CHAOS_NAMES:
            raise click.BadParameter(
                f"{name!r} is not one of {', '.join(CHAOS_NAMES)}", param_hint="--chaos"
            )
        try:
            rate = decimal(share.strip()) if sep else 1.0
        except ValueError:
            rate = -1.0
        if not 0 <= rate <= 1:
            raise click.BadParameter(
                f"the share of {name} is a number from 0 to 1", param_hint="--chaos"
            )
        chaos[name] = rate
    return chaos


@click.group(invoke_without_command=True)
@click.option("--host", help="Address to listen on.  [default: 127.0.0.1]")
@click.option(
    "--port", type=click.IntRange(0, 65535), help="Port (0: any free one).  [default: 8100]"
)
@click.option(
    "--api-key",
    envvar="RELAY_SANDBOX_API_KEY",
    help="The key the app sends in the apikey header (or RELAY_SANDBOX_API_KEY); generated "
    "when not given.",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=MIN_TIME_SCALE, max=MAX_TIME_SCALE),
    callback=lambda _ctx, _param, value: _finite(value),
    help="Platform time runs 1/F times faster: 0.001 runs 48 h of retries in ~3 min "
    f"({MIN_TIME_SCALE:g} to {MAX_TIME_SCALE:g}).  [default: 1]",
)
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A TOML file of sandbox settings (the options override it).",
)
@click.option(
    "--inbound-url", help="Where inbound SMS are sent (replies, and those sent on request)."
)
@click.option(
    "--chaos",
    multiple=True,
    metavar="NAME[=SHARE]",
    help=f"Chaos for a share of requests or messages (1 when no share): {', '.join(CHAOS_NAMES)}; "
    "repeatable.",
)
@click.option("--seed", type=int, help="Seed for the chaos draws (reproducible runs).")
@click.pass_context
def sandbox(ctx: click.Context, **options: Any) -> None:
    """A local fake of the platform's API that calls your app back.

    Prints its base URL and API key, then serves until stopped (Ctrl-C).

    \b
    Example: relay sandbox --time-scale 0.001 --inbound-url http://127.0.0.1:8000/hooks/sms/inbound
    """
    if ctx.invoked_subcommand is not None:
        return
    overrides = {
        "host": options["host"],
        "port": options["port"],
        "api_key": options["api_key"],
        "time_scale": options["time_scale"],
        "inbound_url": options["inbound_url"],
        "seed": options["seed"],
        "chaos": {
            name.replace("-", "_"): rate for name, rate in parse_chaos(options["chaos"]).items()
        },
    }
    try:
        settings = load_sandbox_settings(options["config"], overrides)
    except SandboxSettingsError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        sock = socket.socket(family)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
        sock.listen(BACKLOG)  # connections wait from now on, before the lines below are printed
    except OSError as exc:
        raise click.ClickException(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"
        ) from None
    port = sock.getsockname()[1]
    host = f"[{settings.host}]" if family == socket.AF_INET6 else settings.host
    base_url = f"http://{host}:{port}"
    box = Sandbox(settings, base_url=base_url)
    click.echo(f"relay sandbox: {base_url}")
    click.echo(f"API key: {box.api_key}")
    sys.stdout.flush()  # a pipe (a test, a supervisor) sees the lines before the first request
    config = uvicorn.Config(
        build_app(box), log_level="warning", access_log=False, timeout_graceful_shutdown=2
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


@sandbox.command("numbers")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def numbers_command(as_json: bool) -> None:
    """List the magic numbers: a destination number that forces an outcome."""
    if as_json:
        click.echo(json.dumps([n.as_json() for n in NUMBERS], indent=2))
        return
    rows = [
        (
            n.number,
            n.product,
            n.outcome,
            n.error_code or "",
            n.description + ("" if n.implemented else " (reserved, not served yet)"),
        )
        for n in (*NUMBERS, ANY_OTHER)
    ]
    header = ("NUMBER", "PRODUCT", "OUTCOME", "ERRORCODE", "WHAT HAPPENS")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(4)]
    for row in (header, *rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[4]]))
