"""What reaches the logs: URL tokens are masked in access log lines, and warnings that any
stranger can trigger at will (a WebSocket or h2c upgrade request, which `relay serve` does not
serve) are dropped, so that nobody can flood the log."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

QUERY_PAIR = re.compile(r"(?<=[?&])([^=&#\s]*)=([^&#\s]*)")
MASK = "***"


def redact(text: str) -> str:
    """``/hooks/sms/inbound?token=abc`` -> ``/hooks/sms/inbound?token=***``, also when the key
    is percent-encoded (``%74oken``), since the receiver decodes it before checking it."""
    return QUERY_PAIR.sub(_mask_token, text)


def _mask_token(pair: re.Match[str]) -> str:
    key = pair.group(1)
    if unquote_plus(key).strip().lower() == "token":
        return f"{key}={MASK}"
    return pair.group(0)


class RedactTokens(logging.Filter):
    """A logging filter masking URL tokens in the message and its string arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


UNSERVED_UPGRADE = ("Unsupported upgrade request", "No supported WebSocket library detected")
"""The starts of uvicorn's warnings for an upgrade request (two per request)."""


class DropUpgradeWarnings(logging.Filter):
    """Drops uvicorn's warnings about upgrade requests: no receiver speaks WebSocket or h2c,
    the request is answered as plain HTTP/1.1, and a client could send thousands a second."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(UNSERVED_UPGRADE))


def install(logger_names: tuple[str, ...] = ("uvicorn.access", "uvicorn.error")) -> None:
    """Attach the filters to uvicorn's loggers."""
    for name in logger_names:
        logging.getLogger(name).addFilter(RedactTokens())
    logging.getLogger("uvicorn.error").addFilter(DropUpgradeWarnings())
