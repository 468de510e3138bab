"""The store: the tables every part of callback-relay shares, and the one way rows are written.

The receivers write events through :class:`~receivers.store.writer.EventWriter`; the relay
(which keeps its own tables in ``relay/tables.py`` and the migrations of both in
``relay/migrations/``) uses only the names below."""

from receivers.ids import new_id
from receivers.store.batches import insert_rows, insert_rows_async
from receivers.store.coalescer import Coalescer
from receivers.store.engine import create_engine, sqlite_file
from receivers.store.probe import WriteProbe
from receivers.store.records import Clock, StoredEvent, StoreFull, utc_now
from receivers.store.tables import ReceivedEvent, RejectedBody, UTCDateTime
from receivers.store.writable import StoreWritable, is_unavailable, refusal_of

__all__ = [
    "Clock",
    "Coalescer",
    "ReceivedEvent",
    "RejectedBody",
    "StoreFull",
    "StoreWritable",
    "StoredEvent",
    "UTCDateTime",
    "WriteProbe",
    "create_engine",
    "insert_rows",
    "insert_rows_async",
    "is_unavailable",
    "new_id",
    "refusal_of",
    "sqlite_file",
    "utc_now",
]
