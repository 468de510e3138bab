"""Keep secrets out of logs: the URL token is masked in access log lines."""

from __future__ import annotations

import logging
import re

TOKEN_IN_QUERY = re.compile(r"(?<=[?&]token=)[^&\s]*", re.IGNORECASE)
MASK = "***"


def redact(text: str) -> str:
    """``/hooks/sms/inbound?token=abc`` -> ``/hooks/sms/inbound?token=***``."""
    return TOKEN_IN_QUERY.sub(MASK, text)


class RedactTokens(logging.Filter):
    """A logging filter masking URL tokens in the message and its string arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def install(logger_names: tuple[str, ...] = ("uvicorn.access", "uvicorn.error")) -> None:
    """Attach the filter to the loggers that print request URLs."""
    for name in logger_names:
        logging.getLogger(name).addFilter(RedactTokens())
