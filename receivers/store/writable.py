"""Whether the store takes writes: a state per process and kind of writes, changed by the
outcomes of writes.

A full store (SQLite's "database or disk is full"; a PostgreSQL error of class 53, insufficient
resources, ``disk_full`` among them; ``ENOSPC``) refuses writes until it has room again, and an
unreachable one until it is back. A :class:`StoreWritable` follows one kind of writes of a
process: the callbacks (the event writer's; the readiness checks read it), or the relay's
(routing, the worker's claims and records, the sweeper, the console's actions). Their writers
tell it how each write went; it logs each change once, a WARNING when writes start being
refused and an INFO when one succeeds again, where each failed write used to log a traceback.
Two kinds, not one: a store nearly full may take the one and refuse the other for a while,
which a single state would report as a change at each write.

Only a write that adds rows ends a refusal (a new event, routed deliveries, a recorded attempt,
the probe): an update in place may still fit in a full store where a row does not. A process
that is not ready may get no callbacks, and an idle relay writes nothing, so while the store
refuses them the readiness checks (full store) and the sweeps try the probe
(:mod:`receivers.store.probe`), a write that needs room as a callback does; callbacks that come
meanwhile are still tried too. The first success ends the refusal.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, StatementError

from receivers.store.records import Receipt, StoreFull, StoreUnavailable, StoreUnreachable

log = logging.getLogger(__name__)

SQLITE_FULL = 13
"""SQLite's result code for "database or disk is full" (its low byte, in extended codes too)."""
INSUFFICIENT_RESOURCES = "53"
"""PostgreSQL's error class of ``disk_full`` (53100), ``out_of_memory`` (53200),
``configuration_limit_exceeded`` (53400)."""
TOO_MANY_CONNECTIONS = "53300"
"""Of that class, but about connections, not room: the store is unreachable then."""
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
MAX_REASON_LENGTH = 200


UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57")
"""PostgreSQL's classes of errors that say the server cannot serve now: connection exceptions,
insufficient resources (too many connections, disk full) and operator intervention (a shutdown,
or "the database system is starting up" during a restart)."""
QUERY_CANCELED = "57014"
"""In class 57, but a statement's own time-out or cancellation, not the server's state."""


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot serve now (rather than that a row is at fault)."""
    if isinstance(
        exc,
        OperationalError
        | InterfaceError
        | sqlite3.OperationalError
        | OSError
        | ConnectionError
        | TimeoutError,
    ):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None)
    refused_now = (
        isinstance(sqlstate, str)
        and sqlstate[:2] in UNAVAILABLE_SQLSTATE_CLASSES
        and sqlstate != QUERY_CANCELED
    )
    return exc.connection_invalidated or refused_now


def refusal_of(exc: BaseException) -> StoreUnavailable | None:
    """What ``exc`` says of the store: :class:`StoreFull` or :class:`StoreUnreachable`, with the
    driver's words on one line, or None for any other error (a row at fault, a bug)."""
    if isinstance(exc, StoreFull | StoreUnreachable):
        return exc
    cause = _driver_error(exc)
    if _is_full(cause):
        return StoreFull(reason(exc))
    if is_unavailable(exc) or getattr(cause, "sqlstate", None) == TOO_MANY_CONNECTIONS:
        return StoreUnreachable(reason(exc))
    return None


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's own error behind SQLAlchemy's, else ``exc``."""
    return exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc


def _is_full(cause: BaseException) -> bool:
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == SQLITE_FULL:
        return True
    state = getattr(cause, "sqlstate", None)
    if isinstance(state, str) and state.startswith(INSUFFICIENT_RESOURCES):
        return state != TOO_MANY_CONNECTIONS
    return isinstance(cause, OSError) and cause.errno in FULL_ERRNOS


def reason(exc: BaseException) -> str:
    """The driver's words on one line (never a statement or its parameters)."""
    cause = _driver_error(exc)
    if isinstance(cause, StatementError):
        return type(cause).__name__
    return " ".join(str(cause).split())[:MAX_REASON_LENGTH] or type(cause).__name__


class StoreWritable:
    """Whether the store takes one kind of writes of this process (see the module docstring):
    ``what`` names them in the log lines. ``clock``: seconds, for how long a refusal lasted."""

    def __init__(
        self, what: str = "writes", *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.what = what
        self._clock = clock
        self._refusal: StoreUnavailable | None = None
        self._since = 0.0

    @property
    def refusal(self) -> StoreUnavailable | None:
        """Why writes are refused (:class:`StoreFull`, :class:`StoreUnreachable`); None while
        they succeed."""
        return self._refusal

    @property
    def full(self) -> bool:
        """Whether writes are refused because the store is full."""
        return isinstance(self._refusal, StoreFull)

    def failed(self, exc: BaseException) -> bool:
        """Note a failed write (or read): True when ``exc`` says that the store refuses writes
        (full, unreachable), logged once per change; False for any other error, which is the
        caller's to report."""
        refusal = refusal_of(exc)
        if refusal is None:
            return False
        if self._refusal is None:
            self._since = self._clock()
        if type(refusal) is not type(self._refusal):
            state = "full" if isinstance(refusal, StoreFull) else "unavailable"
            log.warning("the store refuses %s: it is %s (%s)", self.what, state, refusal)
        self._refusal = refusal
        return True

    def succeeded(self) -> None:
        """Note a committed write that added rows: the store takes writes (logged once, after
        a refusal)."""
        if self._refusal is not None:
            self._refusal = None
            elapsed = self._clock() - self._since
            log.info("the store takes %s again after %.1f s", self.what, elapsed)

    def wrote(self, answers: Iterable[object]) -> None:
        """Note the answers of one group of the event writer: a new event among them means
        the store takes writes; else the first refusal among them is noted."""
        refused: StoreUnavailable | None = None
        for answer in answers:
            if isinstance(answer, Receipt) and not answer.duplicate:
                self.succeeded()
                return
            if refused is None and isinstance(answer, StoreFull | StoreUnreachable):
                refused = answer
        if refused is not None:
            self.failed(refused)
