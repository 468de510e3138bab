"""Which failed attempts say the destination is down (the breaker counts them) and which are one
message's own (its schedule only), per destination type; the brokers' cases are asserted in
their own modules (test_dest_amqp, test_dest_nats, test_dest_mqtt, test_broker_surfaces)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    DataError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from relay.destinations import (
    ArqDestination,
    ArqDestinationConfig,
    HttpDestination,
    HttpDestinationConfig,
    Outcome,
    RedisStreamDestination,
    RedisStreamDestinationConfig,
)
from relay.destinations.http import judge
from relay.destinations.redis_errors import redis_down
from tests.conftest import REDIS_URL
from tests.support import Answer, Sink, free_port
from tests.test_destinations import outbound

UNAVAILABLE = {429, 502, 503, 504}
"""What HTTP itself defines as "not now": too many requests, a gateway without its upstream,
unavailable, a gateway's timeout."""


def test_of_all_http_answers_only_429_502_503_504_say_the_destination_is_down() -> None:
    for status in range(100, 600):
        outcome = judge(httpx.Response(status), b"", 1.0)
        assert outcome.ok == (200 <= status < 300), status
        assert outcome.down == (status in UNAVAILABLE), status
        assert outcome.gone == (status == 410), status


@pytest.mark.parametrize(
    ("error", "down"),
    [
        (httpx.ConnectError("refused"), True),
        (httpx.ConnectTimeout("slow"), True),
        (httpx.ReadTimeout("slow"), True),
        (httpx.PoolTimeout("busy"), True),
        (httpx.ReadError("reset"), True),
        (httpx.WriteError("broken pipe"), True),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), True),
        (httpx.LocalProtocolError("Illegal header value"), False),  # our request's fault
    ],
)
async def test_an_http_attempt_without_an_answer_says_down_unless_the_request_was_at_fault(
    error: Exception, down: bool
) -> None:
    """The transport is httpx's pluggable interface: each error a real one raises, in turn."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise error

    config = HttpDestinationConfig(type="http", url="http://127.0.0.1:9/hook")
    destination = HttpDestination("crm", config, transport=httpx.MockTransport(fail))
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()
    assert (outcome.ok, outcome.down) == (False, down)


@pytest.mark.parametrize(
    ("answer", "down"),
    [
        (Answer(500), False),
        (Answer(501), False),
        (Answer(400), False),
        (Answer(401), False),
        (Answer(404), False),
        (Answer(422), False),
        (Answer(301, headers={"location": "/elsewhere"}), False),
        (Answer(410), False),  # gone: its own rule
        (Answer(429), True),
        (Answer(429, headers={"retry-after": "30"}), True),
        (Answer(502), True),
        (Answer(503), True),
        (Answer(504), True),
    ],
)
async def test_an_http_answer_says_down_only_for_unavailability(
    sink: Sink, answer: Answer, down: bool
) -> None:
    sink.answers["/hook"] = answer
    destination = HttpDestination("crm", HttpDestinationConfig(type="http", url=sink.url()))
    try:
        outcome = await destination.deliver(outbound(), timeout=5)
    finally:
        await destination.aclose()
    assert (outcome.ok, outcome.status_code, outcome.down) == (False, answer.status, down)


async def test_an_http_destination_that_refuses_connections_or_does_not_answer_is_down(
    sink: Sink,
) -> None:
    closed = HttpDestinationConfig(type="http", url=f"http://127.0.0.1:{free_port()}/hook")
    sink.answers["/hook"] = Answer(delay=1.0)
    slow = HttpDestinationConfig(type="http", url=sink.url())
    outcomes = []
    for config, timeout in ((closed, 5.0), (slow, 0.1)):
        destination = HttpDestination("crm", config)
        try:
            outcomes.append(await destination.deliver(outbound(), timeout=timeout))
        finally:
            await destination.aclose()
    refused, timed_out = outcomes
    assert (refused.error, refused.down) == ("connection refused", True)
    assert (timed_out.error, timed_out.down) == ("timeout after 0.1s", True)


@pytest.mark.parametrize(
    ("error", "down"),
    [
        (RedisConnectionError("Connection refused"), True),
        (RedisTimeoutError("Timeout reading from socket"), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (BusyLoadingError("Redis is loading the dataset in memory"), True),
        (AuthenticationError("invalid username-password pair"), True),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), True),
        (ReadOnlyError("You can't write against a read only replica."), True),
        (ResponseError("MISCONF Redis is configured to save RDB snapshots, but ..."), True),
        (ResponseError("BUSY Redis is busy running a script."), True),
        (ResponseError("MASTERDOWN Link with MASTER is down"), True),
        (ResponseError("CLUSTERDOWN The cluster is down"), True),
        (ResponseError("TRYAGAIN Multiple keys request during rehashing of slot"), True),
        (ResponseError("NOREPLICAS Not enough good replicas to write."), True),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
        (ResponseError("ERR syntax error"), False),
        (NoPermissionError("this user has no permissions to access the 'events' key"), False),
        (DataError("Invalid input of type: 'dict'."), False),
    ],
)
def test_redis_errors_say_down_for_no_connection_no_room_or_no_writes(
    error: BaseException, down: bool
) -> None:
    assert redis_down(error) is down


Make = Callable[[str], ArqDestination | RedisStreamDestination]
REDIS_DESTINATIONS: dict[str, Make] = {
    "redis-stream": lambda url: RedisStreamDestination(
        "stream",
        RedisStreamDestinationConfig(type="redis-stream", url=url, stream="relay:test:events"),
    ),
    "arq": lambda url: ArqDestination(
        "jobs", ArqDestinationConfig(type="arq", url=url, function="f", queue_name="relay:test")
    ),
}


async def deliver_once(make: Make, url: str, **changes: Any) -> Outcome:
    destination = make(url)
    try:
        return await destination.deliver(outbound(**changes), timeout=5)
    finally:
        await destination.aclose()


@pytest.fixture
async def full_redis(private_redis_url: str) -> AsyncIterator[str]:
    """A Redis of this test's own that refuses every write: out of memory."""
    client = Redis.from_url(private_redis_url)
    await client.config_set("maxmemory-policy", "noeviction")
    await client.config_set("maxmemory", "1")
    await client.aclose()
    yield private_redis_url


@pytest.mark.parametrize("kind", list(REDIS_DESTINATIONS))
async def test_a_redis_out_of_memory_or_unreachable_is_down(full_redis: str, kind: str) -> None:
    full = await deliver_once(REDIS_DESTINATIONS[kind], full_redis)
    closed = await deliver_once(REDIS_DESTINATIONS[kind], f"redis://127.0.0.1:{free_port()}/0")
    assert not full.ok and full.error is not None
    assert full.error.startswith("OutOfMemoryError: ") and full.down
    assert (closed.ok, closed.error, closed.down) == (False, "connection refused", True)


async def test_a_redis_stream_whose_key_holds_another_type_is_refused_not_down(
    redis: Redis,
) -> None:
    await redis.set("relay:test:events", "not a stream")
    outcome = await deliver_once(REDIS_DESTINATIONS["redis-stream"], REDIS_URL)
    assert not outcome.ok and outcome.error is not None and "WRONGTYPE" in outcome.error
    assert not outcome.down
