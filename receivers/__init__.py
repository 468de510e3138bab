"""callback-relay's receiving face: the platform's callbacks, authenticated, validated, stored."""

from receivers.app import create_app
from receivers.config import DEFAULT_SOURCE, ReceiverConfig
from receivers.kinds import KINDS, KINDS_BY_NAME, Kind
from receivers.sources import HeaderCheck, SourceConfig
from receivers.store.records import StoredEvent

__all__ = [
    "DEFAULT_SOURCE",
    "KINDS",
    "KINDS_BY_NAME",
    "HeaderCheck",
    "Kind",
    "ReceiverConfig",
    "SourceConfig",
    "StoredEvent",
    "create_app",
]
