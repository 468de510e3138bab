"""What reaches the logs, whatever the secret: the credentials of a URL's userinfo and the
values of query parameters whose name says they hold a secret are masked in any text (the
pattern layer; :mod:`relay.observe.known_secrets` masks the secrets the settings hold, wherever they
appear), and warnings that any stranger can trigger at will (a WebSocket or h2c upgrade
request, which `relay serve` does not serve) are dropped, so that nobody can flood the log."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

MASK = "***"
USERINFO = re.compile(r"://([^\s/?#]+)@")
"""A URL's userinfo: after ``scheme://``, up to the last ``@`` before the path, query or
fragment (where a URL parser ends it too)."""
ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
NOT_ALNUM = re.compile(r"[\W_]+")
DECODE_ROUNDS = 5
"""At most this many rounds of percent-decoding when normalizing a key."""
SECRET_NAMES = frozenset(
    {
        "auth",
        "authorization",
        "credential",
        "credentials",
        "jwt",
        "key",
        "accesskey",
        "privatekey",
        "secretkey",
        "pass",
        "pwd",
        "session",
        "sessionid",
        "sig",
    }
)
"""Names (lower case, letters and digits only) of query parameters whose value is masked, beside
those ending in one of :data:`SECRET_ENDINGS`."""
SECRET_ENDINGS = ("token", "secret", "password", "passwd", "apikey", "signature")
"""``token``, ``access_token``, ``X-Amz-Security-Token``, ``client_secret``, ``db_password``,
``x-api-key``, ``X-Amz-Signature``...: a name ending so holds a secret."""


LOWERING_TO = {"i": "\u0130", "k": "\u212a"}
"""The characters other than ``I`` and ``K`` whose lower case is ``i`` or ``k`` once reduced
to letters (the dotted capital I, the Kelvin sign)."""


def _spelled(name: str) -> str:
    """A pattern of a raw key that may spell ``name`` once decoded and lowered: each letter, in
    order, literal in either case or an escape's ``%``, anything else between them. Each class
    excludes the next, so the pattern never backtracks."""
    pattern = ""
    for letter in name:
        either = re.escape(letter + letter.upper() + LOWERING_TO.get(letter, "") + "%")
        pattern += f"[^{either}]*[{either}]"
    return pattern


QUERY_PART = re.compile(
    r"([?&;])"
    r"(?=[^?&;#\s]{5})"  # room for a three-letter key, "=" and a value
    r"(?=[^=%?&;#\s]*[=%])"  # an "=", or an escape that may hide one
    r"([^&;#\s]+)"
)
"""A query part (after its separator) that may hold a value to mask: long enough, with an
``=`` or an escape. Both tests are quick and stop at the next separator, so that the work on
a line stays proportional to its length whatever it holds."""
MAYBE_SECRET = re.compile(
    "|".join(_spelled(name) for name in sorted(SECRET_NAMES | set(SECRET_ENDINGS), key=len))
)
"""A raw key with escapes that may decode to a secret's name: a quick test before decoding
(the shortest names first: a key that holds a longer one holds them)."""
NOT_LETTER_OR_ESCAPE = re.compile(r"[^A-Za-z%\u0130\u212a]+")
SHORTEST_NAME = min(len(name) for name in SECRET_NAMES | set(SECRET_ENDINGS))


def is_secret_name(name: str) -> bool:
    """Whether a parameter (or header) of this name holds a secret: its name, lower case and
    reduced to letters and digits, is one of :data:`SECRET_NAMES` or ends in one of
    :data:`SECRET_ENDINGS`."""
    normal = name.lower()
    if not normal.isalnum():
        normal = NOT_ALNUM.sub("", normal)
    return normal in SECRET_NAMES or normal.endswith(SECRET_ENDINGS)


def redact(text: str) -> str:
    """``text`` with its URLs' credentials masked: ``scheme://user:password@`` ->
    ``scheme://user:***@`` (the user name tells which account, the password is the secret),
    ``scheme://token@`` -> ``scheme://***@`` (a user alone may be a token, as NATS reads it),
    and ``?token=abc`` -> ``?token=***`` for every secret-looking parameter however the key is
    spelled: percent-encoded (once or more), with ``%3D`` for ``=``, with brackets
    (``token[]``), in another letter case; see :func:`is_secret_name`. Linear in the text's
    length: neither pattern backtracks beyond the run it matched."""
    if "@" in text:
        text = USERINFO.sub(_mask_userinfo, text)
    return QUERY_PART.sub(_mask_secret_value, text)


def _mask_userinfo(found: re.Match[str]) -> str:
    user, colon, _ = found.group(1).partition(":")
    return f"://{user}:{MASK}@" if colon else f"://{MASK}@"


def _decoded(text: str) -> str:
    """``text`` percent-decoded until it no longer changes, at most ``DECODE_ROUNDS`` times."""
    for _ in range(DECODE_ROUNDS):
        if not ESCAPE.search(text):
            break
        text = unquote(text)
    return text


def _mask_secret_value(part: re.Match[str]) -> str:
    """A query part masked if its key, decoded, names a secret (:func:`is_secret_name`):
    ``key=***`` if the raw part has an ``=`` that the key does not hide, ``***`` if the key
    hides one (``token%3Dsecret``); a key alone holds nothing to mask.

    Decoding never joins text across a literal ``=``, so decoding the raw key alone gives the
    decoded part's key (``+`` is left alone: as a space, it would be stripped all the same)."""
    key, has_eq, _ = part[2].partition("=")
    hidden_eq = ""
    if "%" in key:
        letters = NOT_LETTER_OR_ESCAPE.sub("", key)  # what may spell a name once decoded
        if len(letters) < SHORTEST_NAME or not MAYBE_SECRET.match(letters):
            return part[0]
        name, hidden_eq, _ = _decoded(key).partition("=")
    else:
        name = key
    if not is_secret_name(name):
        return part[0]
    if hidden_eq:  # the key hides a value itself: masked whole (``token%3Dsecret=x``)
        return part[1] + MASK
    return f"{part[1]}{key}={MASK}" if has_eq else part[0]


UNSERVED_UPGRADE = ("Unsupported upgrade request", "No supported WebSocket library detected")
"""The starts of uvicorn's warnings for an upgrade request (two per request)."""


class DropUpgradeWarnings(logging.Filter):
    """Drops uvicorn's warnings about upgrade requests: no receiver speaks WebSocket or h2c,
    the request is answered as plain HTTP/1.1, and a client could send thousands a second."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(UNSERVED_UPGRADE))


def install() -> None:
    """Drop uvicorn's upgrade warnings (secrets are masked by the handler's formatter, see
    :func:`relay.observe.logs.configure_logging`)."""
    logging.getLogger("uvicorn.error").addFilter(DropUpgradeWarnings())
