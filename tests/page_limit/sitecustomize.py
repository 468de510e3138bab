"""Imported first by every Python process a full-store test starts with this folder on its
PYTHONPATH (``relay serve``, the event writer's process): each SQLite connection SQLAlchemy
opens there gets ``PRAGMA max_page_count`` from ``TEST_SQLITE_MAX_PAGE_COUNT``, so that the
store fills up as on a full disk, without root (see tests/full_store_support.py)."""

import os
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

PAGES = os.environ.get("TEST_SQLITE_MAX_PAGE_COUNT")


def _limit_pages(dbapi_connection: Any, _record: Any) -> None:
    if PAGES and "sqlite" in type(dbapi_connection).__module__:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA max_page_count={int(PAGES)}")
        cursor.close()


if PAGES:
    event.listen(Engine, "connect", _limit_pages)
