"""`relay serve`: run the receivers with uvicorn on the configured database."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import click
import uvicorn

from receivers.config import source_prefix
from receivers.kinds import kinds_by_path
from relay import log_redaction
from relay.runtime import Runtime, start
from relay.settings import Settings

GC_YOUNG_THRESHOLD = 20_000
"""Allocations between collections of the youngest generation (Python's default: 700)."""


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop when it is installed (as uvicorn's ``--loop auto`` chooses), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it where it builds
        return asyncio.new_event_loop
    return uvloop.new_event_loop


async def serve(
    settings: Settings, host: str, port: int, log_level: str = "info", *, access_log: bool = True
) -> None:
    """Serve until interrupted."""
    runtime = await start(settings)
    try:
        if runtime.generated_token is not None:
            print_callback_urls(runtime, host, port)
        config = uvicorn.Config(
            runtime.app(),
            host=host,
            port=port,
            log_level=log_level,
            access_log=access_log,
            proxy_headers=False,  # X-Forwarded-For is judged by trusted_proxies, per source
            server_header=False,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        log_redaction.install()
        config.load()  # import the HTTP protocol and build the app now, before the freeze
        calm_garbage_collector()
        await server.serve()
    finally:
        await runtime.engine.dispose()


def calm_garbage_collector() -> None:
    """Keep the cyclic garbage collector off the request path: what start-up built is frozen
    (never scanned again), and the youngest generation is collected less often."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def print_callback_urls(runtime: Runtime, host: str, port: int) -> None:
    """Tell the operator which URLs to give the platform (printed once, never logged)."""
    shown_host = "<this-host>" if host in ("0.0.0.0", "::") else host
    base = f"http://{shown_host}:{port}{source_prefix('default')}"
    click.echo("No sources configured: generated a token for the default source")
    click.echo("(kept in the database; configure [sources.default] to choose your own).")
    click.echo("Give the platform these callback URLs (use your public https address):")
    for path, kinds in kinds_by_path().items():
        names = list(dict.fromkeys(kind.name for kind in kinds))  # a kind's variants: one name
        label = names[0] if len(names) == 1 else names[0].split(".")[0] + ".*"
        click.echo(f"  {label:<16} {base}{path}?token={runtime.generated_token}")
