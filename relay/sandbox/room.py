"""Memory bound for lookups and calls, as ``State.forget_finished`` is for messages: at most
``max_messages`` of each are kept; beyond, the oldest finished ones are forgotten with their
callbacks, and when all are still under way a new one is a 503 problem."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from receivers.problems import Problem
from relay.sandbox.state import FINISHED, Callback


def make_room(
    records: MutableMapping[str, Any],
    callbacks: MutableMapping[str, Callback],
    keep: int,
    finished: Callable[[Any], bool],
    what: str,
) -> None:
    """Forget the oldest finished ``records`` (``finished`` and every callback done) until
    fewer than ``keep`` remain; a 503 problem when they are all still under way."""
    for key, record in list(records.items()):
        if len(records) < keep:
            return
        ids = record.callbacks
        done = all(callbacks.get(c) is None or callbacks[c].state in FINISHED for c in ids)
        if done and finished(record):
            del records[key]
            for callback_id in ids:
                callbacks.pop(callback_id, None)
    if len(records) >= keep:
        raise Problem(
            503,
            "sandbox-full",
            "Service Unavailable",
            f"The sandbox holds {len(records)} {what} still under way (max_messages); wait, "
            "or reset it (POST /_sandbox/reset).",
            headers={"Retry-After": "1"},
        )
