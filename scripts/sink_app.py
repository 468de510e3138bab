"""A recording HTTP sink: the destination of ``scripts/bench_relay.py``.

Every POST at any path (other than ``/_bench/...``) has its body read and is answered 200 with an
empty body. For each one it records, in memory, the ``webhook-id`` header, the arrival time
(``time.time()``: wall-clock seconds since the Unix epoch, i.e. UTC, taken once the body has been
read) and the body. Nothing is parsed while requests come in; the bodies are only decoded when
the records are fetched.

Failure modes (for ``scripts/chaos.py``; the default mode ``ok`` is the behaviour above):

- ``fail``: every POST is answered ``500`` at once;
- ``slow``: every POST is answered 200 only after ``delay`` seconds (longer than the relay's
  destination timeout: the relay sees a timeout, the sink has the event all the same).

``/_bench/count`` and ``/_bench/records`` only show the requests answered 200 in mode ``ok``;
``/_bench/answers`` shows every request with the status given and the mode it met.

Control routes (for the benchmark):

- ``GET /_bench/healthz``: 200 once the app is up;
- ``GET /_bench/count``: ``{"requests": n, "distinct": d}`` (requests recorded, distinct
  webhook-ids among them);
- ``GET /_bench/records``: ``[[webhook_id, arrival, received_at], ...]`` in arrival order, where
  ``received_at`` is the envelope's field (``null`` when the body is not an envelope);
- ``POST /_bench/reset``: forget every record (and every answer);
- ``POST /_bench/mode``: ``{"mode": "ok" | "fail" | "slow", "delay": seconds}`` (204);
- ``GET /_bench/answers``: ``[[webhook_id, arrival, received_at, status, mode], ...]`` for every
  POST in arrival order (``status``: the status answered; in mode ``slow`` it is sent
  ``delay`` seconds after ``arrival``, when the caller may have given up).

Run: ``python -m uvicorn sink_app:app --app-dir scripts --port 8002``
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

RECORDS: list[tuple[str, float, bytes]] = []
SEEN: set[str] = set()
MODES = ("ok", "fail", "slow")
MODE: dict[str, Any] = {"mode": "ok", "delay": 0.0}
ANSWERS: list[tuple[str, float, bytes, int, str]] = []
"""Every POST: webhook-id, arrival, body, status answered, mode met (only used by chaos.py)."""


async def record(request: Request) -> Response:
    """Read the body, note who arrived when, answer 200 (or as the failure mode says)."""
    try:
        body = await request.body()
    except ClientDisconnect:  # the sender died mid-request (a killed worker): nothing arrived
        return Response(status_code=400)
    arrived = time.time()
    webhook_id = request.headers.get("webhook-id", "")
    mode = MODE["mode"]
    status = 500 if mode == "fail" else 200
    ANSWERS.append((webhook_id, arrived, body, status, mode))
    if mode == "fail":
        return Response(status_code=status)
    if mode == "slow":
        await asyncio.sleep(MODE["delay"])
        return Response(status_code=status)
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
    ANSWERS.clear()
    return Response(status_code=204)


async def set_mode(request: Request) -> Response:
    """Switch the failure mode: ``{"mode": "ok" | "fail" | "slow", "delay": seconds}``."""
    try:
        document = json.loads(await request.body())
        mode = document["mode"]
        delay = float(document.get("delay", 0.0))
    except (ValueError, KeyError, TypeError):
        return Response(b"expected {mode, delay}", status_code=400)
    if mode not in MODES or delay < 0:
        return Response(b"unknown mode or negative delay", status_code=400)
    MODE.update(mode=mode, delay=delay)
    return Response(status_code=204)


async def answers(_: Request) -> Response:
    rows = [
        [webhook_id, arrived, _received_at(body), status, mode]
        for webhook_id, arrived, body, status, mode in ANSWERS
    ]
    return JSONResponse(rows)


app = Starlette(
    routes=[
        Route("/_bench/healthz", healthz, methods=["GET"]),
        Route("/_bench/count", count, methods=["GET"]),
        Route("/_bench/records", records, methods=["GET"]),
        Route("/_bench/reset", reset, methods=["POST"]),
        Route("/_bench/mode", set_mode, methods=["POST"]),
        Route("/_bench/answers", answers, methods=["GET"]),
        Route("/{path:path}", record, methods=["POST"]),
    ]
)
