"""The event loop `relay serve`, `relay worker` and the event writer process run on.

A speed trick: uvloop (libuv, in C) runs the same asyncio code with less CPU per callback and
per socket operation. ``auto`` takes it where it is installed (uvicorn's ``--loop auto`` does
the same): `relay serve` then acknowledges about 10 % more callbacks/s
(``scripts/bench_ingest.py``) and `relay worker` delivers about 10 % more events/s to
RabbitMQ (``scripts/bench_relay.py --destination amqp``; to HTTP, NATS and MQTT it gains less
than the noise). To turn it off, run `relay serve` and `relay worker` with ``--loop asyncio`` (or
``RELAY_LOOP=asyncio``): the writer process then runs on asyncio's loop too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal, get_args

LoopName = Literal["auto", "asyncio", "uvloop"]
LOOP_NAMES: tuple[LoopName, ...] = get_args(LoopName)


class LoopUnavailable(RuntimeError):
    """``uvloop`` was asked for where it is not installed."""


def loop_factory(name: LoopName = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the event loop ``name`` asks for: ``asyncio``'s own, ``uvloop`` (an error
    where it is not installed) or ``auto`` (uvloop where it is installed, else asyncio's)."""
    if name == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it where it builds
        if name == "uvloop":
            raise LoopUnavailable("--loop uvloop: uvloop is not installed") from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> LoopName:
    """The name of the kind of ``loop`` (so that a child process runs on the same kind)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it where it builds
        return "asyncio"
    return "uvloop" if isinstance(loop, uvloop.Loop) else "asyncio"
