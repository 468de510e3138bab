"""A connection pool in shards: httpcore's pool walks every connection it holds on each request
(and asks each idle one whether its socket has become readable, a system call), so one pool of
many connections costs CPU in proportion to its size. Small pools side by side do not.

A speed trick, public httpx API only: with one pool of 200, a plain ``httpx.AsyncClient`` made
about 500 POSTs/s on the benchmark machine, where the relay's client (these shards, no cookie
jar) makes over twice that (``scripts/bench_relay.py``, docs/performance.md). To turn it off,
give :func:`~relay.destinations.http.new_http_client` an ``httpx.AsyncHTTPTransport`` of your
own; nothing else knows of the shards."""

from __future__ import annotations

import itertools
import math

import httpx

CONNECTIONS_PER_SHARD = 8


class ShardedTransport(httpx.AsyncBaseTransport):
    """Spreads requests round-robin over pools of at most ``CONNECTIONS_PER_SHARD``
    connections, within the same overall ``limits``; the pools share one TLS context (httpx's
    default: certificates verified, ``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured)."""

    def __init__(self, limits: httpx.Limits) -> None:
        total = limits.max_connections or CONNECTIONS_PER_SHARD
        count = max(1, math.ceil(total / CONNECTIONS_PER_SHARD))
        keepalive = limits.max_keepalive_connections
        shard_limits = httpx.Limits(
            max_connections=math.ceil(total / count),
            max_keepalive_connections=None if keepalive is None else math.ceil(keepalive / count),
            keepalive_expiry=limits.keepalive_expiry,
        )
        # one TLS context for all: each loads the system's CA store (~20 ms of start-up apiece)
        tls = httpx.create_ssl_context()
        self._shards = [
            httpx.AsyncHTTPTransport(verify=tls, limits=shard_limits) for _ in range(count)
        ]
        self._next = itertools.cycle(self._shards)

    @property
    def shards(self) -> int:
        """How many pools there are."""
        return len(self._shards)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await next(self._next).handle_async_request(request)

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()
