"""Keep secrets out of logs: the URL token is masked in access log lines."""

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


def install(logger_names: tuple[str, ...] = ("uvicorn.access", "uvicorn.error")) -> None:
    """Attach the filter to the loggers that print request URLs."""
    for name in logger_names:
        logging.getLogger(name).addFilter(RedactTokens())
