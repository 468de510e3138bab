"""Short, secret-free descriptions of delivery errors (and of the URLs of services and of
database errors)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from relay.observe.log_redaction import redact

MAX_ERROR_LENGTH = 200


class DestinationRefused(Exception):
    """A destination whose setup can never deliver; the worker does not start with it."""


def timeout_error(timeout: float) -> str:
    """The error for an attempt that ran out of time."""
    return f"timeout after {float(timeout)}s"


def describe_error(exc: BaseException) -> str:
    """A short description of a network error, naming the root cause when it is a common one."""
    for cause in _chain(exc):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
        if isinstance(cause, socket.gaierror):
            return "name resolution failed"
        if isinstance(cause, TimeoutError):
            return "timeout"
    text = redact(_text(exc)).strip()  # a client's error may quote the URL it was given
    described = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return storable(described)[:MAX_ERROR_LENGTH]


def describe_database_error(exc: BaseException) -> str:
    """The database driver's own words (``database "x" does not exist``), on one line."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return " ".join(str(exc.orig).split())[:MAX_ERROR_LENGTH] or type(exc.orig).__name__
    return describe_error(exc)


def without_credentials(url: str) -> str:
    """``url`` to show: without user, password, query or fragment (where secrets go)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def database_address(url: str | URL) -> str:
    """A database URL to show, without user, password or query, read as SQLAlchemy reads it:
    its password may hold ``/``, ``?`` or ``#``, where :func:`without_credentials` would end
    the userinfo and show the rest."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except ArgumentError:
        return without_credentials(str(url))
    return without_credentials(parsed.render_as_string(hide_password=True))


def storable(text: str) -> str:
    """``text`` as every store and log accepts it: NUL (which PostgreSQL's text refuses) and
    what UTF-8 cannot encode (lone surrogates) become backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a buggy __str__ must not fail the description
        return ""


def _chain(exc: BaseException, limit: int = 10) -> list[BaseException]:
    """The exception and its causes/contexts, outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < limit and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
