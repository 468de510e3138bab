"""`relay serve`: run the receivers with uvicorn on the configured database."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
from collections.abc import Coroutine, Iterator
from typing import Any

import click
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from receivers.config import DEFAULT_SOURCE, source_prefix
from receivers.kinds import kinds_by_path
from relay.console.access import GENERATED_USER, ConsoleAccess
from relay.console.web import CONSOLE_PATH
from relay.observe import log_redaction
from relay.observe.known_secrets import KnownSecrets
from relay.server.admin_listener import ADMIN_PATHS, AdminSplit
from relay.server.connection_guard import ConnectionGuard, EdgeLimits
from relay.server.default_source import GeneratedToken, TokenUse
from relay.server.listening import Listeners, listening, reason, url_host
from relay.server.runtime import Runtime, start
from relay.settings import Settings, SettingsError

try:
    import resource
except ImportError:  # pragma: no cover - Windows counts no sockets against an open-files limit
    resource = None  # type: ignore[assignment]

log = logging.getLogger("relay.serve")  # stable: users filter on it

OTHER_FILES = 256
"""Open files kept for everything but client connections: the database and its writer process,
the embedded worker's outgoing connections (up to 200), logs, Redis."""
SHUTDOWN_SECONDS = 10
"""How long a stop waits for requests under way before it cancels them (a request whose event
was committed is then answered as a duplicate when the platform retries it)."""
CONNECTIONS_WITHOUT_LIMIT = 10_000
"""The connection cap where the system has no open-files limit to derive it from (Windows)."""


async def serve(
    settings: Settings,
    host: str,
    port: int,
    log_level: str = "info",
    *,
    access_log: bool = True,
    secrets: KnownSecrets | None = None,
) -> None:
    """Serve until interrupted; the values the installation generated are added to the
    ``secrets`` its logs mask. The ports are bound first: one that cannot be is a
    :class:`SettingsError` before anything else starts."""
    with listening(settings, host, port) as listeners:
        runtime = await start(settings)
        if secrets is not None:
            secrets.add(*runtime.generated_secrets())
        try:
            if runtime.generated is not None:
                print_generated_token(
                    runtime.generated, list(settings.sources), host, listeners.public.port
                )
            if runtime.console is not None:
                print_console_url(runtime.console, listeners.console.host, listeners.console.port)
            app: ASGIApp = runtime.app()
            if listeners.admin is not None:
                app = AdminSplit(app, listeners.admin.port)
            untold = RefusalUntold(app, runtime)
            config = server_config(untold, settings, host, port, log_level, access_log=access_log)
            server = ListeningServer(config, listeners)
            log_redaction.install()
            config.load()  # import the HTTP protocol and build the app now, before the freeze
            freeze_startup_objects()
            try:
                with untold.untold_by_uvicorn():
                    await server.serve(sockets=listeners.sockets)
            except SystemExit:  # uvicorn's exit when the app's start fails
                if runtime.refused is not None:
                    raise runtime.refused from None
                raise
        finally:
            await finish(runtime.engine.dispose())


class ListeningServer(uvicorn.Server):
    """uvicorn's server on the sockets bound beforehand (:mod:`relay.server.listening`); once
    started, it says where it listens, as uvicorn does for a port it binds itself."""

    def __init__(self, config: uvicorn.Config, listeners: Listeners) -> None:
        super().__init__(config)
        self._listeners = listeners

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        except OSError as exc:  # a process that bound a port too listened on it first
            await self.lifespan.shutdown()
            raise SettingsError(f"cannot listen on the ports bound: {reason(exc)}") from None
        if not self.started:
            return
        public, admin = self._listeners.public, self._listeners.admin
        logging.getLogger("uvicorn.error").info(
            "Uvicorn running on %s (Press CTRL+C to quit)", public.url
        )
        if admin is not None:
            log.info("admin listener on %s: %s", admin.url, ", ".join(sorted(ADMIN_PATHS)))


async def finish(closing: Coroutine[Any, Any, None]) -> None:
    """Await ``closing`` to its end, even if this task is cancelled meanwhile (then cancelled
    after it). After its own shutdown, uvicorn raises the SIGINT it caught again, so that
    asyncio cancels the main task: the database's connections would be left half-closed."""
    closed = asyncio.ensure_future(closing)
    try:
        await asyncio.shield(closed)
    except asyncio.CancelledError:
        await closed
        raise


STARTUP_FAILED_LINE = "Application startup failed. Exiting."
"""What uvicorn logs when an app's start failed."""


class RefusalUntold:
    """The app, whose start refused by a setting (``runtime.refused``: a destination that can
    never deliver) is told by `relay serve` alone, as one line: uvicorn would log the
    lifespan's traceback and its own line first."""

    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self._app = app
        self._runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self._app(scope, receive, send)
            return

        async def told(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed" and self._runtime.refused:
                message = {**message, "message": ""}
            await send(message)

        await self._app(scope, receive, told)

    @contextlib.contextmanager
    def untold_by_uvicorn(self) -> Iterator[None]:
        """Meanwhile uvicorn's "startup failed" line is dropped after such a refusal."""

        def keep(record: logging.LogRecord) -> bool:
            return not (self._runtime.refused and record.getMessage() == STARTUP_FAILED_LINE)

        logger = logging.getLogger("uvicorn.error")
        logger.addFilter(keep)
        try:
            yield
        finally:
            logger.removeFilter(keep)


def server_config(
    app: ASGIApp,
    settings: Settings,
    host: str,
    port: int,
    log_level: str = "info",
    *,
    access_log: bool = True,
) -> uvicorn.Config:
    """uvicorn's configuration for `relay serve`: httptools behind the connection guard (which
    bounds what a client may hold before it is authenticated; see
    ``relay.server.connection_guard``)."""
    guard = ConnectionGuard(edge_limits(settings))
    return uvicorn.Config(
        guard.watch(app),
        host=host,
        port=port,
        http=guard.protocol_factory(HttpToolsProtocol),  # type: ignore[arg-type]
        ws="none",  # no receiver speaks WebSocket
        log_config=None,  # records go to the handler of relay.observe.logs.configure_logging
        log_level=log_level,
        access_log=access_log,
        proxy_headers=False,  # X-Forwarded-For is judged by trusted_proxies, per source
        server_header=False,
        lifespan="on",
        # a request still coming in (a stranger's slow body) does not hold a stop up beyond this
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
    )


def edge_limits(settings: Settings) -> EdgeLimits:
    """The guard's limits from the settings. Raises the soft open-files limit to the hard one
    first, since the connection cap is derived from it."""
    allowed = connections_allowed(raise_open_files_limit())
    wanted = settings.max_connections or allowed
    if wanted > allowed:
        log.warning(
            "max_connections %d is more than the open-files limit allows; serving at most %d",
            wanted,
            allowed,
        )
    return EdgeLimits(
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        header_timeout=settings.header_timeout.total_seconds(),
        body_timeout=settings.body_timeout.total_seconds(),
        max_connections=min(wanted, allowed),
    )


def raise_open_files_limit() -> int | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (where the system lets us); the soft
    limit now in force (None without one)."""
    if resource is None:  # pragma: no cover
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the kernel caps
            log.debug("open-files limit stays at %d: %s", soft, exc)
        else:
            soft = hard
    return None if soft == resource.RLIM_INFINITY else soft


def connections_allowed(open_files: int | None) -> int:
    """Client connections that fit in ``open_files`` descriptors: all but :data:`OTHER_FILES`
    and a tenth (connections accepted in one burst hold a descriptor until the guard closes
    others), and at least half."""
    if open_files is None:  # pragma: no cover
        return CONNECTIONS_WITHOUT_LIMIT
    return max(open_files // 2, open_files - OTHER_FILES - open_files // 10)


def freeze_startup_objects() -> None:
    """Move everything start-up built (modules, the app, its models) out of the garbage
    collector's reach, so that its full collections stop scanning them again and again while
    requests come (a speed trick of `relay serve`: ``scripts/bench_ingest.py`` measured
    0.495-0.497 against 0.455 without it, same code otherwise). Off: do not call it; nothing
    else depends on it."""
    gc.collect()
    gc.freeze()


def shown_address(host: str, port: int) -> str:
    """The server's address as the operator should type it."""
    shown_host = "<this-host>" if host in ("0.0.0.0", "::") else url_host(host)
    return f"http://{shown_host}:{port}"


def print_console_url(console: ConsoleAccess, host: str, port: int) -> None:
    """Tell the operator where the console is (and its generated password, never logged)."""
    url = f"{shown_address(host, port)}{CONSOLE_PATH}"
    if console.generated_password is None:
        click.echo(f"Console: {url} (users from [console.users])")
        return
    click.echo(f"Console: {url}  user {GENERATED_USER}, password {console.generated_password}")
    click.echo("(kept in the database; configure [console.users] to choose your own).")


def print_generated_token(
    generated: GeneratedToken, configured: list[str], host: str, port: int
) -> None:
    """Tell the operator what the default source's generated token does and why, and while it
    serves, the URLs to give the platform (printed at every start, never logged);
    ``configured`` names the configured sources."""
    if generated.use is TokenUse.RETIRED:
        click.echo(
            "The default source's generated token is retired: [sources.default] is configured,\n"
            "and its callbacks must pass the checks configured there (the generated token counts\n"
            "only if it is listed there). `relay sources forget-default` deletes it from the "
            "database."
        )
        return
    if generated.use is TokenUse.ALONE:
        if generated.new:
            click.echo("No sources configured: generated a token for the default source")
        else:
            click.echo(
                "No sources configured: the default source keeps the token generated at an "
                "earlier start (the same URLs as before)"
            )
        click.echo("(kept in the database; configure [sources.default] to choose your own).")
        click.echo("Give the platform these callback URLs (use your public https address):")
    else:
        click.echo(
            f"Sources configured: {', '.join(configured)}; [sources.default] is not.\n"
            "The default source is still served with the token generated at an earlier start "
            "(kept in the\ndatabase), because the platform may still call its URLs and would "
            "lose its callbacks to a 404.\nTo retire it, configure [sources.default] or run "
            "`relay sources forget-default`.\nIts callback URLs (use your public https address):"
        )
    print_callback_urls(generated.token, host, port)


def print_callback_urls(token: str, host: str, port: int) -> None:
    """The default source's callback URLs with ``token``, one per receiver path."""
    base = f"{shown_address(host, port)}{source_prefix(DEFAULT_SOURCE)}"
    for path, kinds in kinds_by_path().items():
        names = list(dict.fromkeys(kind.name for kind in kinds))  # a kind's variants: one name
        label = names[0] if len(names) == 1 else names[0].split(".")[0] + ".*"
        click.echo(f"  {label:<16} {base}{path}?token={token}")
