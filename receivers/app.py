"""The Starlette app factory of the receivers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from receivers.config import ReceiverConfig, source_prefix
from receivers.handler import HookEndpoint, store_problem
from receivers.kinds import kinds_by_path
from receivers.metrics import Metrics, ReceiverCounters
from receivers.openapi import openapi_document
from receivers.problems import Problem, not_found
from receivers.readiness import DatabasePing
from receivers.routing import ReceiverApp
from receivers.store.in_commit import InCommitWriter
from receivers.store.probe import WriteProbe
from receivers.store.records import AfterCommit, StoreFull, utc_now
from receivers.store.writer import WRITING_HOOK, EventWriter, HookTiming

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 2.0


def create_app(
    config: ReceiverConfig,
    engine: AsyncEngine,
    *,
    after_commit: AfterCommit | None = None,
    clock: Callable[[], datetime] = utc_now,
    around: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    metrics: Metrics | None = None,
    hook_timing: HookTiming = WRITING_HOOK,
    in_commit: InCommitWriter | None = None,
) -> Starlette:
    """The receivers app: every kind's URL for every configured source, plus health checks.

    ``after_commit`` is awaited with the newly stored events after each commit (the relay's
    hook); the receivers themselves know nothing about relaying. ``around`` is entered before
    the store's writer starts and left after it has stopped (what the hook needs lives there).
    ``metrics`` holds the registry ``/metrics`` serves (a new one of the app's own by default);
    the receivers' counters are registered in it. ``hook_timing``: when the hook is called
    (see :mod:`receivers.store.writer`).
    ``in_commit``: what else each transaction that stores events writes (the relay's outbox,
    :mod:`receivers.store.in_commit`).
    """
    metrics = metrics if metrics is not None else Metrics()
    counters = ReceiverCounters(metrics.registry)
    writer = EventWriter(
        engine,
        clock=clock,
        after_commit=after_commit,
        writer_process=config.writer_process,
        hook_timing=hook_timing,
        in_commit=in_commit,
    )
    probe = WriteProbe(engine, writer.writable, clock)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with around() if around else contextlib.nullcontext():
            await writer.start()
            try:
                yield
            finally:
                await writer.stop()

    routes: list[Route] = []
    hooks: dict[tuple[str, str], HookEndpoint] = {}
    for source_name, source in config.sources.items():
        prefix = source_prefix(source_name)
        for path, kinds in kinds_by_path().items():
            endpoint = HookEndpoint(
                source_name=source_name,
                source=source,
                kinds=kinds,
                config=config,
                writer=lambda: writer,
                counters=counters,
                clock=clock,
            )
            # with and without a trailing slash: the platform follows no redirect
            for url in (prefix + path, prefix + path + "/"):
                # no method list: the endpoint answers 405 itself (Starlette would add HEAD)
                routes.append(Route(url, endpoint))
                hooks.update({(url, method): endpoint for method in endpoint.methods})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    ping = DatabasePing(engine, READY_TIMEOUT_SECONDS, writer.writable)

    async def readyz(request: Request) -> Response:
        """Ready: the writer runs, and the database answers or, while the store refuses the
        callbacks for being full, takes the probe's write (:mod:`receivers.store.writable`)."""
        if not writer.available:
            return _not_ready("The event writer is not running.")
        writable = writer.writable
        try:
            if writable.full:
                await asyncio.wait_for(probe(), READY_TIMEOUT_SECONDS)
            else:
                await ping()  # logged once per change (the callbacks' state)
        except Exception:
            if writable.full:
                return store_problem(StoreFull()).response()
            return _not_ready("The database is not reachable.")
        return JSONResponse({"status": "ready"})

    document = openapi_document(config)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    async def scrape(request: Request) -> Response:
        body, content_type = await metrics.exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    routes += [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", scrape, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    app = ReceiverApp(
        hooks=hooks,
        on_error=_server_problem,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_problem, Exception: _server_problem},
    )
    # a redirect is no answer for the platform (it follows none), and Starlette builds its
    # Location from the caller's Host header: an unknown path is a 404 problem instead
    app.router.redirect_slashes = False
    app.state.metrics = metrics
    app.state.counters = counters
    app.state.writer = writer
    return app


def _not_ready(detail: str) -> Response:
    return Problem(
        503, "store-unavailable", "Service Unavailable", detail, headers={"Retry-After": "5"}
    ).response()


async def _http_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return not_found(request.url.path).response()
    if exc.status_code == 405:
        title, detail = (
            "Method Not Allowed",
            f"{request.method} is not accepted at {request.url.path}.",
        )
    else:
        title, detail = "Error", str(exc.detail)
    slug = title.lower().replace(" ", "-")
    return Problem(exc.status_code, slug, title, detail, headers=dict(exc.headers or {})).response()


async def _server_problem(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return Problem(
        500,
        "internal-error",
        "Internal Server Error",
        "An unexpected error occurred; it has been logged.",
    ).response()
