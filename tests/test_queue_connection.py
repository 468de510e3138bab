"""The queue connection's state machine: one WARNING line when Redis is lost, one INFO line when
it is back, probes in between on a capped, jittered exponential backoff; and the outage lines
of any service (the database too). Redis here is fakeredis told to refuse every command
(``FakeServer.connected = False``), with an injected clock and sleep: no waiting."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import fakeredis
import pytest
from arq.connections import ArqRedis
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from relay.dispatch.outage import Outage, duration_text
from relay.dispatch.queue_connection import Backoff, QueueConnection
from tests.store_support import within

PASSWORD = "hunter2-never-shown"


@dataclass
class Ticks:
    """A monotonic clock the test moves by hand."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Redis:
    """An arq pool on a fakeredis server the test can take down and bring back."""

    server: fakeredis.FakeServer = field(default_factory=fakeredis.FakeServer)

    def __post_init__(self) -> None:
        fake = fakeredis.FakeAsyncRedis(server=self.server)
        self.pool = ArqRedis(connection_pool=fake.connection_pool)

    def down(self) -> None:
        self.server.connected = False

    def up(self) -> None:
        self.server.connected = True


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    redis = Redis()
    yield redis
    await redis.pool.aclose()


class Sleeps:
    """An injected sleep: records each wait, moves the clock by it, and after ``probes_down``
    probes brings Redis back (the probe after that one answers)."""

    def __init__(self, redis: Redis, clock: Ticks, probes_down: int) -> None:
        self.waits: list[float] = []
        self._redis, self._clock, self._probes_down = redis, clock, probes_down

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self._clock.now += seconds
        if len(self.waits) > self._probes_down:
            self._redis.up()
        await asyncio.sleep(0)


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= level]


def refused() -> RedisConnectionError:
    return RedisConnectionError("Error 111 connecting to 127.0.0.1:6399. Connection refused.")


def test_an_outage_is_two_lines_whatever_the_number_of_failed_calls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = Ticks()
    outage = Outage("database", clock=clock)
    assert outage.back() is None  # not lost: nothing to say
    assert outage.lost(OSError("connection reset")) is True
    clock.now += 2.5
    assert outage.lost(OSError("again")) is False
    assert outage.lost(OSError("and again")) is False
    assert outage.ongoing
    assert outage.back() == 2.5
    assert outage.back() is None
    assert not outage.ongoing
    assert lines(caplog) == [
        ("WARNING", "database lost: OSError: connection reset"),
        ("INFO", "database back after 2.5 s"),
    ]
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert [r.levelname for r in tracebacks] == ["DEBUG"]  # the first failure's, at DEBUG only


def test_a_second_outage_gets_its_own_two_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Ticks()
    outage = Outage("queue", clock=clock)
    for lasted in (1.0, 300.0):
        outage.lost(refused())
        clock.now += lasted
        outage.back()
    assert [message for _, message in lines(caplog)] == [
        "queue lost: ConnectionError: Error 111 connecting to 127.0.0.1:6399. Connection refused.",
        "queue back after 1.0 s",
        "queue lost: ConnectionError: Error 111 connecting to 127.0.0.1:6399. Connection refused.",
        "queue back after 5 min 0 s",
    ]


def test_the_lost_line_names_no_credential(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    outage = Outage("queue")
    outage.lost(RedisConnectionError(f"cannot reach redis://:{PASSWORD}@10.0.0.5:6379/0"))
    assert outage.reason is not None and PASSWORD not in outage.reason
    assert all(PASSWORD not in r.getMessage() for r in caplog.records if not r.exc_info)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.04, "0.0 s"),
        (2.345, "2.3 s"),
        (59.94, "59.9 s"),
        (125, "2 min 5 s"),
        (12_000, "3 h 20 min"),
    ],
)
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_backoff_doubles_up_to_its_cap_each_wait_drawn_in_the_upper_half() -> None:
    backoff = Backoff(first=0.1, cap=2.0, rng=random.Random(7))
    waits = [wait for _, wait in zip(range(12), backoff.delays(), strict=False)]
    bounds = [min(0.1 * 2**n, 2.0) for n in range(12)]
    for wait, bound in zip(waits, bounds, strict=True):
        assert bound / 2 <= wait <= bound
    assert max(waits) <= 2.0
    other = Backoff(first=0.1, cap=2.0, rng=random.Random(8))
    assert waits != [w for _, w in zip(range(12), other.delays(), strict=False)]  # jitter


async def test_a_lost_queue_is_probed_on_the_backoff_until_redis_answers(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = Ticks()
    sleeps = Sleeps(redis, clock, probes_down=3)
    registry = CollectorRegistry()
    connection = QueueConnection(
        redis.pool,
        registry=registry,
        backoff=Backoff(rng=random.Random(1)),
        sleep=sleeps,
        clock=clock,
    )
    back: list[None] = []
    connection.on_back(lambda: back.append(None))

    def gauge() -> float | None:
        return registry.get_sample_value("relay_queue_connected")

    assert connection.connected and gauge() == 1
    redis.down()
    connection.lost(refused())
    assert not connection.connected and gauge() == 0
    assert connection.reason is not None and "Connection refused" in connection.reason
    connection.lost(refused())  # another caller finds it gone too: no second probe, no line
    await within(connection.until_connected())

    expected = Backoff(rng=random.Random(1)).delays()
    assert sleeps.waits == [next(expected) for _ in range(4)]  # 3 refused probes, 1 answered
    assert connection.connected and gauge() == 1 and connection.reason is None
    assert back == [None]
    assert lines(caplog) == [
        ("WARNING", f"queue lost: {connection_reason(refused())}"),
        ("INFO", f"queue back after {duration_text(sum(sleeps.waits))}"),
    ]
    await connection.aclose()


def connection_reason(error: BaseException) -> str:
    outage = Outage("x")
    outage.lost(error)
    assert outage.reason is not None
    return outage.reason


class ScriptedPool:
    """Answers PING with each of ``answers`` in turn (an exception is raised)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)

    async def ping(self) -> object:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_a_probe_that_redis_answers_with_an_error_is_a_failed_probe() -> None:
    """A Redis that answers PING with an error (one it does not call a connection error) is
    not back: probing goes on, it does not end."""
    pool = ScriptedPool(ResponseError("NOPERM this user has no permissions"), True)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    connection = QueueConnection(pool, sleep=sleep)  # type: ignore[arg-type]
    connection.lost(refused())
    await within(connection.until_connected())
    assert len(waits) == 2 and pool.answers == []


async def test_closing_stops_a_probe_under_way(redis: Redis) -> None:
    redis.down()
    started = asyncio.Event()

    async def sleep(seconds: float) -> None:
        started.set()
        await asyncio.sleep(3600)

    connection = QueueConnection(redis.pool, sleep=sleep)
    connection.lost(refused())
    await within(started.wait())
    await within(connection.aclose())
    assert not connection.connected
    await connection.aclose()  # again: nothing left to stop
