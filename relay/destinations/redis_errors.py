"""Which Redis failures say that Redis cannot take any write now (the breaker counts them).

Shared by the destinations that write to Redis (``redis-stream``, ``arq``): no connection, a
timeout, or a reply of unavailability or capacity (out of memory, loading its data, a read-only
replica, a failed background save, a busy script, a cluster without its master). Any other
reply (``WRONGTYPE``, ``NOPERM``...) is an answer to that command: it fails the attempt without
counting toward the breaker (see :attr:`relay.destinations.Outcome.down`).
"""

from __future__ import annotations

from redis.exceptions import (
    ConnectionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

UNAVAILABLE_REPLIES = frozenset(
    {
        "BUSY",
        "CLUSTERDOWN",
        "LOADING",
        "MASTERDOWN",
        "MISCONF",
        "NOREPLICAS",
        "OOM",
        "READONLY",
        "TRYAGAIN",
    }
)
"""Error replies that say Redis cannot take writes now, by their first word."""


def redis_down(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a Redis write, says Redis cannot take any write now."""
    if isinstance(exc, ConnectionError | RedisTimeoutError | OSError | TimeoutError):
        return True  # BusyLoadingError (LOADING) and failed logins are connection errors too
    if isinstance(exc, OutOfMemoryError | ReadOnlyError):
        return True  # redis-py strips the first word of these replies
    if isinstance(exc, ResponseError):
        return str(exc).split(" ", 1)[0] in UNAVAILABLE_REPLIES
    return False
