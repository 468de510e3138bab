"""What the event writer and its own process say to each other over their socket.

Each message is a frame: its length (4 bytes, little-endian), then a value in :mod:`marshal`'s
format, which both ends read and write in C at memory speed (both are this same interpreter).

- writer -> process: ``(sent_at, records)``: the writer's clock when it sent them (ISO 8601), and
  the items in arrival order, each a tuple (:func:`record_of`).
- process -> writer: ``(received_at, answers)`` for the oldest items not answered yet, in their
  order: the batch's timestamp (ISO 8601), and per item ``(event id, duplicate)`` for a stored
  event, ``None`` for a quarantined body, or the name of the error that kept it from being
  stored (a string).

Standard library only: the process imports it too."""

from __future__ import annotations

import marshal
import struct
from typing import Any

from receivers.store.records import Arrival, Rejection
from receivers.store.rows import Item, ItemReceipt

HEADER = struct.Struct("<I")
EVENT, REJECTION = 0, 1

Record = tuple[Any, ...]
Answer = ItemReceipt | str
"""An item's answer on the wire: its receipt, or the name of the error that failed it."""


def frame(value: Any) -> bytes:
    """``value`` as one frame."""
    body = marshal.dumps(value)
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Cuts the frames out of a byte stream, however it was split."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Take ``data``; the value of every frame it completes."""
        buffer = self._buffer
        buffer += data
        values = []
        start = 0
        with memoryview(buffer) as view:
            while len(buffer) - start >= HEADER.size:
                (size,) = HEADER.unpack_from(view, start)
                end = start + HEADER.size + size
                if end > len(buffer):
                    break
                values.append(marshal.loads(view[start + HEADER.size : end]))
                start = end
        del buffer[:start]
        return values

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buffer)


def record_of(item: Item) -> Record:
    """An item as a tuple of plain values."""
    if isinstance(item, Arrival):
        return (
            EVENT,
            item.source,
            item.kind,
            item.dedup_key,
            item.payload,
            item.raw_body,
            item.content_type,
            item.method,
            item.remote_addr,
        )
    return (
        REJECTION,
        item.source,
        item.path,
        item.kind,
        item.status,
        item.reason,
        item.errors,
        item.raw_body,
        item.content_type,
        item.remote_addr,
    )


def item_of(record: Record) -> Item:
    """The item a record was made of."""
    if record[0] == EVENT:
        return Arrival(*record[1:])
    return Rejection(*record[1:])
