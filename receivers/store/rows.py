"""The rows of a batch: one per event (its copies in the batch counted on it), one per rejected
body (deduplicated by body hash), and the receipt each item of the batch gets once written.

Standard library only: the event writer's own process builds its batches with it too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from receivers.ids import new_ids
from receivers.store.records import Arrival, Identity, Rejection, Row, body_hash, identity

CONTENT_TYPE_LENGTH = 255
"""The longest Content-Type kept (the column's width; a longer header is cut)."""
REMOTE_ADDR_LENGTH = 64
"""The longest caller address kept (an IPv6 address with a long zone id is cut)."""
PATH_LENGTH = 255
"""The longest request path kept with a quarantined body."""
REASON_LENGTH = 1000
"""The longest refusal reason kept with a quarantined body (it may name many fields)."""

Item = Arrival | Rejection
ItemReceipt = tuple[str, bool] | None
"""What an item of a batch gets: (event id, duplicate) for an event, None for a rejected body."""


@dataclass(slots=True)
class BatchRows:
    """A batch's rows, and which items each event row stands for (first arrival first)."""

    events: list[Row]
    rejections: list[Row]
    copies: list[list[int]]


def batch_rows(items: Sequence[Item], now: datetime) -> BatchRows:
    """The rows of ``items``, all received ``now``."""
    copies: dict[Identity, list[int]] = {}
    rejected: dict[str, tuple[Rejection, int]] = {}
    for index, item in enumerate(items):
        if isinstance(item, Arrival):
            copies.setdefault(item.identity, []).append(index)
        else:
            digest = body_hash(item.raw_body)
            seen = rejected.get(digest)
            rejected[digest] = (seen[0], seen[1] + 1) if seen else (item, 1)
    ids = new_ids(now, len(copies) + len(rejected))
    events = [
        _event_row(items[same[0]], len(same), event_id, now)
        for same, event_id in zip(copies.values(), ids, strict=False)
    ]
    rejection_ids = ids[len(copies) :]
    quarantine = [
        _rejection_row(item, digest, count, row_id, now)
        for (digest, (item, count)), row_id in zip(rejected.items(), rejection_ids, strict=True)
    ]
    return BatchRows(events, quarantine, list(copies.values()))


def receipts(rows: BatchRows, stored: Mapping[Identity, str], count: int) -> list[ItemReceipt]:
    """What each of the batch's ``count`` items gets, given every identity's stored id: a copy
    of an event in the batch, or of one stored before, is a duplicate."""
    answers: list[ItemReceipt] = [None] * count
    for row, same in zip(rows.events, rows.copies, strict=True):
        event_id = stored[identity(row)]
        new = event_id == row["id"]
        for position, index in enumerate(same):
            answers[index] = (event_id, position > 0 or not new)
    return answers


def _event_row(first: Item, arrivals: int, event_id: str, now: datetime) -> Row:
    """The row of an event that arrived ``arrivals`` times in one batch."""
    assert isinstance(first, Arrival)
    return {
        "id": event_id,
        "source": first.source,
        "kind": first.kind,
        "dedup_key": first.dedup_key,
        "received_at": now,
        "payload": first.payload,
        "raw_body": first.raw_body,
        "content_type": _clip(first.content_type, CONTENT_TYPE_LENGTH),
        "method": first.method,
        "remote_addr": _clip(first.remote_addr, REMOTE_ADDR_LENGTH),
        "duplicates": arrivals - 1,
    }


def _rejection_row(item: Rejection, digest: str, count: int, row_id: str, now: datetime) -> Row:
    """The quarantine row of a body that was rejected ``count`` times in one batch."""
    return {
        "id": row_id,
        "source": item.source,
        "path": item.path[:PATH_LENGTH],
        "kind": item.kind,
        "status": item.status,
        "reason": item.reason[:REASON_LENGTH],
        "errors": item.errors,
        "body_hash": digest,
        "raw_body": item.raw_body,
        "content_type": _clip(item.content_type, CONTENT_TYPE_LENGTH),
        "remote_addr": _clip(item.remote_addr, REMOTE_ADDR_LENGTH),
        "received_at": now,
        "last_seen_at": now,
        "count": count,
    }


def _clip(text: str | None, length: int) -> str | None:
    """``text`` cut to a column's width (PostgreSQL refuses longer text; SQLite would keep it)."""
    return text[:length] if text is not None else None
