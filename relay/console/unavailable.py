"""A database that cannot be reached, or is full, answers the console's requests with a 503,
not a 500.

Every console request but the bare login form reads the database (its session, the throttle,
the pages' lists), so an outage is an answer of its own: 503 with Retry-After, as a page for a
browser, else as problem+json, saying which (full or unreachable). One line is logged when the
database goes away and one when it is back (a full store is the server's state of the relay's
writes, logged once by it), never a traceback per request.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from receivers.handler import RETRY_AFTER_SECONDS
from receivers.store.records import StoreFull
from receivers.store.writable import refusal_of
from relay.console.web import OPERATOR, Console, error

log = logging.getLogger("relay.console")


class DatabaseDown:
    """Turns an unreachable database, raised by anything inside, into a 503."""

    def __init__(self, app: ASGIApp, console: Console) -> None:
        self.app = app
        self.console = console
        self._down = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as exc:
            refusal = None if started else refusal_of(exc)
            if refusal is None:
                raise
            if isinstance(refusal, StoreFull):
                # the relay's writes meet it too: the server's one state of them logs it once,
                # and its return when a write succeeds again
                self.console.writable.failed(exc)
                detail = "The store is full: it takes no writes until room is made; retry later."
            else:
                if not self._down:
                    self._down = True
                    log.warning("console: the database cannot be reached: %s", refusal)
                detail = "The database cannot be reached; retry later."
            response = error(self.console, Request(scope), 503, "Service Unavailable", detail)
            response.headers["retry-after"] = RETRY_AFTER_SECONDS
            await response(scope, receive, send)
            return
        if self._down and scope.get(OPERATOR) is not None:  # a session was read: it is back
            self._down = False
            log.info("console: the database can be reached again")
