"""What `relay serve` and `relay worker` print: one handler on standard error, as text or as one
JSON object per line. Its formatter masks secrets in everything it prints, whatever logger
wrote the record (ours, uvicorn's, httpx's, the brokers' clients...): the message, the
``extra`` context, the traceback and the stack, first the secrets the settings hold
(:mod:`relay.observe.known_secrets`), then URL credentials and secret query values in any text
(:mod:`relay.observe.log_redaction`).

Records about a delivery carry its context as ``extra`` fields (:data:`CONTEXT_FIELDS`): the
JSON lines have them as keys, the text lines append them as ``key=value``."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from relay.observe.known_secrets import MIN_MASKED_LENGTH, KnownSecrets
from relay.observe.log_redaction import redact

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
CONTEXT_FIELDS = ("event_id", "delivery_id", "destination", "attempt", "status_code", "user")
"""The ``extra`` fields a record about a delivery may carry, in the order they are shown."""
QUIET_LOGGERS = ("alembic", "aiosqlite")
"""Loggers shown from WARNING up only: alembic tells every migration step at INFO, aiosqlite
every database call at DEBUG, with its parameters (the events' personal data, the secrets an
installation generates)."""
DEBUG_ONLY_LOGGERS = ("httpx", "httpcore", "arq.worker", "arq.jobs")
"""Loggers that tell every request or job at INFO (httpx's ``HTTP Request`` line per HTTP
delivery, arq's line per job started and ended): their INFO records show only at ``debug``,
their warnings and errors at every level. What happened to a delivery is told by
``relay.delivery`` (a line per failed attempt) instead."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SCALARS = (bool, int, float, type(None))
"""Context values a JSON line keeps as they are; any other is printed as its masked text."""
OWN_FIELDS = ("time", "level")
"""The fields of a JSON line that hold nothing but what the formatter wrote."""
MAX_UNPRINTABLE_CHARS = 200
"""How much of the message of a record that cannot be printed is told."""
log = logging.getLogger("relay.logs")  # stable: users filter on it


class Redaction:
    """Masks secrets in a printed text: those the settings hold (``known``), then those any
    pattern finds (URL credentials, secret query values)."""

    def __init__(self, known: KnownSecrets | None = None) -> None:
        self.known = KnownSecrets() if known is None else known

    def __call__(self, text: str) -> str:
        return redact(self.known.mask(text))


class TextLines(logging.Formatter):
    """``time LEVEL logger: message key=value ...`` (the traceback and stack, if any, before the
    context), the whole text masked by ``redaction``."""

    def __init__(self, redaction: Callable[[str], str] | None = None) -> None:
        super().__init__(TEXT_FORMAT)
        self.redaction = Redaction() if redaction is None else redaction

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{key}={value}" for key, value in _context(record).items())
        return self.redaction(f"{line} {context}" if context else line)


class JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the delivery's
    context, the exception's traceback and the stack when there are; every text masked by
    ``redaction`` before it is encoded (masking the encoded line could break its JSON)."""

    def __init__(self, redaction: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.redaction = Redaction() if redaction is None else redaction

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
        elif record.exc_text:  # formatted elsewhere: the event writer's process
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        masked = {
            key: value
            if isinstance(value, SCALARS) or key in OWN_FIELDS
            else self.redaction(str(value))
            for key, value in entry.items()
        }
        return json.dumps(masked, ensure_ascii=False)


class MaskedLines(logging.StreamHandler):
    """The one handler: a record that cannot be printed (arguments that do not fit its
    message, say) is told in one line with its message masked, where logging would print a
    traceback and the record's arguments as they are."""

    def __init__(self, redaction: Redaction) -> None:
        super().__init__()
        self.redaction = redaction

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        message = self.redaction(str(record.msg))[:MAX_UNPRINTABLE_CHARS]
        try:
            self.stream.write(
                f"a record of {record.name} could not be printed "
                f"({type(error).__name__}): {message!r}{self.terminator}"
            )
            self.flush()
        except Exception:  # standard error itself is gone: nothing else to tell it to
            pass


def configure_logging(
    level: str = "info", log_format: LogFormat = "text", secrets: KnownSecrets | None = None
) -> logging.Handler:
    """Send every logger's records at ``level`` and above to standard error in ``log_format``,
    masking ``secrets`` (and URL credentials) in every line; returns the handler (replacing any
    that was installed on the root logger before). A secret too short to be masked wherever
    it appears is told once, by its place (see
    :data:`relay.observe.known_secrets.MIN_MASKED_LENGTH`)."""
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}")
    redaction = Redaction(secrets)
    handler = MaskedLines(redaction)
    handler.setFormatter(JsonLines(redaction) if log_format == "json" else TextLines(redaction))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET_LOGGERS:  # a failing start stays one line
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    for name in DEBUG_ONLY_LOGGERS:
        per_event = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
        logging.getLogger(name).setLevel(max(per_event, root.level))
    for place in redaction.known.too_short:
        log.warning(
            "the secret in %s is shorter than %d characters: it is masked in the logs only "
            "where it appears as a URL's password or a secret query parameter",
            place,
            MIN_MASKED_LENGTH,
        )
    return handler


def _context(record: logging.LogRecord) -> dict[str, object]:
    return {
        key: getattr(record, key)
        for key in CONTEXT_FIELDS
        if getattr(record, key, None) is not None
    }
