"""Who may use the console of this installation, and mounting it into `relay serve`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from receivers.store import StoreWritable, utc_now
from relay.console.app import console_app
from relay.console.sessions import end_outdated_sessions
from relay.console.users import Users
from relay.console.web import CONSOLE_PATH, Enqueue, SecurityHeaders, see_other
from relay.server.bootstrap import CONSOLE_PASSWORD_KEY, CONSOLE_SESSION_KEY, kept_secret
from relay.settings import Settings

GENERATED_USER = "admin"


@dataclass(frozen=True)
class ConsoleAccess:
    """The console's users and signing key; ``generated_password`` is set when the password of
    ``admin`` was generated (no ``[console.users]`` configured), to be printed at start."""

    users: dict[str, str]
    key: str
    generated_password: str | None


async def console_access(
    settings: Settings, engine: AsyncEngine, clock: Callable[[], datetime] = utc_now
) -> ConsoleAccess | None:
    """The console's access for these settings (None when the console is turned off). The
    sessions of users no longer configured, or opened under another password than a user's
    current one, end here: on every replica, since they are kept in the database."""
    if not settings.console.enabled:
        return None
    key = await kept_secret(engine, CONSOLE_SESSION_KEY)
    if settings.console.users:
        users = {name: secret.get_secret_value() for name, secret in settings.console.users.items()}
        access = ConsoleAccess(users, key, None)
    else:
        password = await kept_secret(engine, CONSOLE_PASSWORD_KEY)
        access = ConsoleAccess({GENERATED_USER: password}, key, password)
    await end_outdated_sessions(engine, Users(key, access.users), clock())
    return access


def mount_console(
    app: Starlette,
    access: ConsoleAccess,
    settings: Settings,
    engine: AsyncEngine,
    enqueue: Enqueue,
    clock: Callable[[], datetime],
    *,
    sources: list[str],
    writable: StoreWritable | None = None,
) -> None:
    """Serve the console at ``/console`` in ``app``; ``sources`` are the served sources (the
    configured ones, and the default source while its generated token serves it). Its actions
    tell ``writable`` (the server's) when the store refuses their writes."""
    console = console_app(
        engine,
        Users(access.key, access.users),
        access.key,
        enqueue,
        sources=sources,
        destinations=list(settings.destinations),
        targets={name: f"{d.type}: {d.target()}" for name, d in settings.destinations.items()},
        clock=clock,
        session_lifetime=settings.console.session_lifetime,
        secure_cookie=settings.console.secure_cookie,
        trusted_proxies=settings.trusted_proxies,
        writable=writable,
    )
    home = SecurityHeaders(see_other(CONSOLE_PATH + "/events"))
    app.router.routes += [
        Route(CONSOLE_PATH, home),
        Mount(CONSOLE_PATH, app=console),
    ]
