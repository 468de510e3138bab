"""Rows written in the transaction that stores new events: the relay's outbox.

A user of the store (the relay, which routes each event to its deliveries) gives the event
writer an :class:`InCommitWriter`: where its function is (``"package.module:factory"``) and a
JSON argument to build it with. Each lane loads it where it writes, the writer's own process too,
and calls it inside every transaction that stores new events, with those events: its rows commit
with them or not at all, and no transaction of its own competes for the store's write lock
after the commit. It answers one marshal-able value per event (the relay: the event's delivery
ids), which the after-commit hook gets as :attr:`StoredEvent.written_with`.

Should it fail (a fault of its own, not a store that refuses writes), the group is written again
without it: the events are stored all the same, with ``written_with`` None, for the user to
catch up on (the relay's sweeper routes unrouted events). One line is logged when it starts to
fail, with its traceback, and one when it works again; not one per group.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from receivers.store.records import StoredEvent

log = logging.getLogger(__name__)

WriteInCommit = Callable[[Connection, Sequence[StoredEvent]], list[Any]]
"""Writes what goes with these new events on the connection of their transaction; one value per
event, in order."""


class InCommitFailed(Exception):
    """The in-commit writer raised (its error is the cause): the group is written without it."""


@dataclass(frozen=True)
class InCommitWriter:
    """Where the in-commit writer's factory is, and its argument (JSON, so that it can be given
    to the writer's own process on its command line)."""

    factory: str
    """``"package.module:function"``; the function takes :attr:`argument`, answers a
    :data:`WriteInCommit`."""
    argument: Any = None

    def to_json(self) -> str:
        return json.dumps({"factory": self.factory, "argument": self.argument})

    @classmethod
    def from_json(cls, text: str) -> InCommitWriter:
        value = json.loads(text)
        return cls(value["factory"], value["argument"])

    def load(self) -> InCommit | None:
        """The writer, built; None, logged, when it cannot be (the events are then stored
        without it, as when it fails)."""
        try:
            module, _, name = self.factory.partition(":")
            factory = getattr(importlib.import_module(module), name)
            return InCommit(factory(self.argument))
        except Exception:
            log.exception(
                "could not load the outbox writer %s; events are stored without it", self.factory
            )
            return None


class InCommit:
    """A loaded in-commit writer, with the state of its failures (logged once per change)."""

    def __init__(self, write: WriteInCommit) -> None:
        self._write = write
        self._failing = False

    def __call__(self, conn: Connection, events: Sequence[StoredEvent]) -> dict[str, Any]:
        """Each event's value, by event id; :class:`InCommitFailed` when the writer raised."""
        if not events:
            return {}
        try:
            values = self._write(conn, events)
        except Exception as exc:
            raise InCommitFailed(type(exc).__name__) from exc
        return {event.id: value for event, value in zip(events, values, strict=True)}

    def failed(self, error: InCommitFailed) -> None:
        """The group is written again without it; the first failure in a row is logged."""
        if not self._failing:
            self._failing = True
            log.error(
                "writing the outbox with the events failed (%s); events are stored without it "
                "until it works again",
                error,
                exc_info=error.__cause__,
            )

    def succeeded(self) -> None:
        if self._failing:
            self._failing = False
            log.info("writing the outbox with the events works again")
