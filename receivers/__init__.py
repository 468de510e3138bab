"""callback-relay's receiving face: the platform's callbacks, authenticated, validated, stored.

The public names are imported when first used, so that the event writer's own process
(:mod:`receivers.store.writer_process`) starts without loading the web stack."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from receivers.app import create_app
    from receivers.config import DEFAULT_SOURCE, ReceiverConfig
    from receivers.kinds import KINDS, KINDS_BY_NAME, Kind
    from receivers.sources import HeaderCheck, SourceConfig
    from receivers.store.records import StoredEvent

_EXPORTS = {
    "DEFAULT_SOURCE": "receivers.config",
    "KINDS": "receivers.kinds",
    "KINDS_BY_NAME": "receivers.kinds",
    "HeaderCheck": "receivers.sources",
    "Kind": "receivers.kinds",
    "ReceiverConfig": "receivers.config",
    "SourceConfig": "receivers.sources",
    "StoredEvent": "receivers.store.records",
    "create_app": "receivers.app",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'receivers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
