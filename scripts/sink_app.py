"""A recording HTTP sink: the destination of ``scripts/bench_relay.py``.

Every POST at any path (other than ``/_bench/...``) has its body read and is answered 200 with an
empty body. For each one it records, in memory, the ``webhook-id`` header, the arrival time
(``time.time()``: wall-clock seconds since the Unix epoch, i.e. UTC, taken once the body has been
read) and the body. Nothing is parsed while requests come in; the bodies are only decoded when
the records are fetched.

Control routes (for the benchmark):

- ``GET /_bench/healthz``: 200 once the app is up;
- ``GET /_bench/count``: ``{"requests": n, "distinct": d}`` (requests recorded, distinct
  webhook-ids among them);
- ``GET /_bench/records``: ``[[webhook_id, arrival, received_at], ...]`` in arrival order, where
  ``received_at`` is the envelope's field (``null`` when the body is not an envelope);
- ``POST /_bench/reset``: forget every record.

Run: ``python -m uvicorn sink_app:app --app-dir scripts --port 8002``
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

RECORDS: list[tuple[str, float, bytes]] = []
SEEN: set[str] = set()


async def record(request: Request) -> Response:
    """Read the body, note who arrived when, answer 200."""
    body = await request.body()
    arrived = time.time()
    webhook_id = request.headers.get("webhook-id", "")
    RECORDS.append((webhook_id, arrived, body))
    SEEN.add(webhook_id)
    return Response(status_code=200)


async def healthz(_: Request) -> Response:
    return Response(b"ok", media_type="text/plain")


async def count(_: Request) -> Response:
    return JSONResponse({"requests": len(RECORDS), "distinct": len(SEEN)})


def _received_at(body: bytes) -> Any:
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document.get("received_at") if isinstance(document, dict) else None


async def records(_: Request) -> Response:
    rows = [[webhook_id, arrived, _received_at(body)] for webhook_id, arrived, body in RECORDS]
    return JSONResponse(rows)


async def reset(_: Request) -> Response:
    RECORDS.clear()
    SEEN.clear()
    return Response(status_code=204)


app = Starlette(
    routes=[
        Route("/_bench/healthz", healthz, methods=["GET"]),
        Route("/_bench/count", count, methods=["GET"]),
        Route("/_bench/records", records, methods=["GET"]),
        Route("/_bench/reset", reset, methods=["POST"]),
        Route("/{path:path}", record, methods=["POST"]),
    ]
)
