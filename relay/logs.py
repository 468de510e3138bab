"""What `relay serve` and `relay worker` print: one handler on standard error, as text or as one
JSON object per line, with URL tokens masked in every record (see :mod:`relay.log_redaction`).

Records about a delivery carry its context as ``extra`` fields (:data:`CONTEXT_FIELDS`): the
JSON lines have them as keys, the text lines append them as ``key=value``."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Literal

from relay.log_redaction import RedactTokens

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
CONTEXT_FIELDS = ("event_id", "delivery_id", "destination", "attempt", "status_code", "user")
"""The ``extra`` fields a record about a delivery may carry, in the order they are shown."""
QUIET_LOGGERS = ("alembic",)
"""Loggers shown from WARNING up only (alembic tells every migration step at INFO)."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextLines(logging.Formatter):
    """``time LEVEL logger: message key=value ...``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{key}={value}" for key, value in _context(record).items())
        return f"{line} {context}" if context else line


class JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the delivery's
    context, and the exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", log_format: LogFormat = "text") -> logging.Handler:
    """Send every logger's records at ``level`` and above to standard error in ``log_format``;
    returns the handler (replacing any that was installed on the root logger before)."""
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLines() if log_format == "json" else TextLines())
    handler.addFilter(RedactTokens())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET_LOGGERS:  # a failing start stays one line
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    return handler


def _context(record: logging.LogRecord) -> dict[str, object]:
    return {
        key: getattr(record, key)
        for key in CONTEXT_FIELDS
        if getattr(record, key, None) is not None
    }
