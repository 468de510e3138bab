"""The receivers' Starlette app, with a direct lane to the receiver URLs.

A callback at a receiver URL, with one of that URL's methods, is handed straight to its
:class:`~receivers.handler.HookEndpoint`: one dict lookup instead of Starlette's scan of every
route, and no middleware, ``Request`` or ``Response`` in between. Anything else (other paths,
other methods, HEAD, a trailing slash, a ``root_path``, added middleware) takes Starlette's usual
way, where the same endpoints are mounted as plain routes, so every answer stays the same.

A speed trick: the server's event loop is the ingest's bottleneck, and this keeps its work per
callback near the endpoint's own (see docs/performance.md, Ingest; measured with
``scripts/bench_ingest.py``). To turn it off, add any middleware to the app: every request then
takes Starlette's way. Nothing outside this module and the app factory knows of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from receivers.handler import HookEndpoint, send_answer

ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class ReceiverApp(Starlette):
    """A Starlette app; ``hooks`` maps (path, method) to the endpoint that answers it there.

    ``on_error`` answers an unexpected exception on the direct lane, as Starlette's
    ``ServerErrorMiddleware`` would with the same handler (the exception is re-raised after)."""

    def __init__(
        self,
        *,
        hooks: Mapping[tuple[str, str], HookEndpoint],
        on_error: ErrorHandler,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._hooks = dict(hooks)
        self._on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path") and self._direct():
            endpoint = self._hooks.get((scope["path"], scope["method"]))
            if endpoint is not None:
                scope["app"] = self
                try:
                    answer = await endpoint.answer(scope, receive)
                except Exception as exc:
                    response = await self._on_error(Request(scope), exc)
                    await response(scope, receive, send)
                    raise
                await send_answer(send, answer)
                return
        await super().__call__(scope, receive, send)

    def _direct(self) -> bool:
        """Whether nothing was configured that Starlette's way would run for every request."""
        return not self.user_middleware and not self.debug and self.max_body_size is None
