"""A no-op Starlette receiver: the baseline of ``scripts/bench_ingest.py``.

Every POST, at any path, has its body read and is answered 200 with a small JSON body; GET at
any path answers the same (the benchmark polls it to know the server is up). Nothing is parsed,
validated or stored, so its throughput is what uvicorn and Starlette cost on their own.

Run: ``python -m uvicorn noop_app:app --app-dir scripts --port 8001``
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ANSWER = b'{"status":"accepted"}'


async def accept(request: Request) -> Response:
    """Read the body, then acknowledge it."""
    await request.body()
    return Response(ANSWER, media_type="application/json")


app = Starlette(routes=[Route("/{path:path}", accept, methods=["GET", "POST"])])
