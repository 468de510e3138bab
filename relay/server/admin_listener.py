"""With ``admin_port``: which paths each of `relay serve`'s two listeners serves.

The public listener is the platform's: the receivers (``/hooks/...``) and the health checks. The
admin listener is the operators': the console, ``/metrics``, ``/openapi.json`` and the health
checks. Anything else is answered 404, as an unknown path is, whatever the method: the public
port does not even tell that the console exists. Both listeners are sockets of one server, so
a request's listener is told by the local port it came in on (the ports differ).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from receivers.config import DEFAULT_SOURCE, source_prefix
from receivers.problems import not_found
from relay.console.web import CONSOLE_PATH

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
ADMIN_PATHS = HEALTH_PATHS | {"/metrics", "/openapi.json", CONSOLE_PATH}
ADMIN_PREFIX = CONSOLE_PATH + "/"
PUBLIC_PREFIX = source_prefix(DEFAULT_SOURCE) + "/"
"""Every source's receivers are below it."""


def serves(admin: bool, path: str) -> bool:
    """Whether the admin listener (else the public one) serves ``path``."""
    if admin:
        return path in ADMIN_PATHS or path.startswith(ADMIN_PREFIX)
    return path in HEALTH_PATHS or path.startswith(PUBLIC_PREFIX)


class AdminSplit:
    """``app`` served on two listeners, each with its own paths (:func:`serves`)."""

    def __init__(self, app: ASGIApp, admin_port: int) -> None:
        self._app = app
        self._admin_port = admin_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            local = scope.get("server")  # None where the socket has no address: public
            admin = local is not None and local[1] == self._admin_port
            if not serves(admin, scope["path"]):
                await not_found(scope["path"]).response()(scope, receive, send)
                return
        await self._app(scope, receive, send)
