"""The secrets the settings hold, masked wherever they appear in a printed line (the second
layer of :func:`relay.observe.logs.configure_logging`, after the patterns of
:mod:`relay.observe.log_redaction`): every ``SecretStr`` (tokens, basic-auth pairs, header values,
signature, console and ``whsec_`` secrets), the credentials and secret-looking query values of
every URL (destinations, ``redis_url``, ``database_url``), and the values of destination
headers whose name says they hold a secret. `relay serve` adds the values it generates (the
default source's token, the console's password and session key) once it has read them."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

from pydantic import BaseModel, SecretStr
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from relay.observe.log_redaction import MASK, is_secret_name

MIN_MASKED_LENGTH = 8
"""The shortest secret masked wherever it appears: a shorter one (``guest``, ``1234``) would
mask ordinary words and numbers all over the logs. It is still masked where the patterns find
it (a URL's password, a secret query parameter)."""
UPPER_ESCAPE = re.compile(r"%[0-9A-F]{2}")
HEADER_SECRET_WORDS = ("auth", "token", "secret", "key", "pass", "pwd", "sig", "cookie", "session")
"""A destination header whose name holds one of these carries a secret (``Authorization``,
``X-Api-Key``, ``Cookie``...)."""
USER_IS_TOKEN = frozenset({"nats", "tls", "redis", "rediss"})
"""Schemes whose user alone (``nats://TOKEN@host``) is a credential: NATS reads it as a token,
and a Redis password is often written there by mistake. Elsewhere (``postgresql://relay@db``)
a user alone is a name, not a secret."""


class KnownSecrets:
    """Literal secrets to mask in every line printed, each in every form it may be printed in:
    as is, percent-encoded (``%2F`` or ``%2f``, ``+`` or ``%20`` for a space), escaped as in a
    JSON string or a Python repr, and the key alone of a ``whsec_`` secret.

    ``too_short`` names the places whose secret is shorter than :data:`MIN_MASKED_LENGTH`
    (masked by the patterns only)."""

    def __init__(self, secrets: Iterable[str] = (), too_short: Iterable[str] = ()) -> None:
        self._forms: tuple[str, ...] = ()
        self.too_short = tuple(too_short)
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        """Mask these too (``None`` and those shorter than :data:`MIN_MASKED_LENGTH` are left
        out). Safe while other threads log: the forms are replaced at once."""
        forms = set(self._forms)
        for secret in secrets:
            if secret is not None and len(secret) >= MIN_MASKED_LENGTH:
                forms |= printed_forms(secret)
        # the longest first: a secret that holds another is masked whole
        self._forms = tuple(sorted(forms, key=lambda form: (-len(form), form)))

    def mask(self, text: str) -> str:
        """``text`` with every form of every secret replaced by ``***``."""
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        return text


def printed_forms(secret: str) -> set[str]:
    """The forms ``secret`` may be printed in (see :class:`KnownSecrets`)."""
    encoded = {quote(secret, safe=""), quote(secret), quote_plus(secret, safe="")}
    lower = {UPPER_ESCAPE.sub(lambda escape: escape[0].lower(), form) for form in encoded}
    escaped = {json.dumps(secret, ensure_ascii=ascii)[1:-1] for ascii in (False, True)}
    forms = {secret, repr(secret)[1:-1], *escaped}
    forms |= encoded | lower
    key = secret.removeprefix("whsec_")
    if key != secret and len(key) >= MIN_MASKED_LENGTH:
        forms.add(key)
    return {form for form in forms if len(form) >= MIN_MASKED_LENGTH}


def known_secrets(settings: BaseModel) -> KnownSecrets:
    """Every secret ``settings`` hold (see the module's docstring)."""
    found = list(secrets_in(settings, ""))
    return KnownSecrets(
        (secret for _, secret in found),
        sorted({place for place, secret in found if len(secret) < MIN_MASKED_LENGTH}),
    )


def secrets_in(value: Any, place: str) -> Iterator[tuple[str, str]]:
    """(place, secret) for every secret in a settings value, walking models, tables and lists;
    ``place`` is the dotted name of the value (``destinations.crm.url``)."""
    if isinstance(value, SecretStr):
        yield place, value.get_secret_value()
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _field_secrets(getattr(value, name), _join(place, name))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from secrets_in(item, _join(place, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from secrets_in(item, _join(place, str(index)))


def _field_secrets(value: Any, place: str) -> Iterator[tuple[str, str]]:
    """The secrets of a model's field: a URL's (``url``, ``*_url``), a secret header's, a
    basic-auth pair's, or those of whatever the value holds."""
    name = place.rpartition(".")[2]
    if isinstance(value, str) and (name == "url" or name.endswith("_url")):
        secrets = url_secrets(value, database=name == "database_url")
        yield from ((place, secret) for secret in secrets)
    elif name == "headers" and isinstance(value, Mapping):
        for header, text in value.items():
            if isinstance(text, str) and any(w in header.lower() for w in HEADER_SECRET_WORDS):
                yield from _header_secrets(text, f"{place}.{header}")
    elif name == "basic_auth" and isinstance(value, list):
        for index, pair in enumerate(value):
            yield from _basic_auth_secrets(pair.get_secret_value(), f"{place}.{index}")
    else:
        yield from secrets_in(value, place)


def _basic_auth_secrets(pair: str, place: str) -> Iterator[tuple[str, str]]:
    """A ``user:password`` pair, its password, and the pair as ``Authorization: Basic``
    carries it."""
    user, _, password = pair.partition(":")
    yield place, pair
    yield place, password
    yield place, base64.b64encode(f"{user}:{password}".encode()).decode()


def _header_secrets(text: str, place: str) -> Iterator[tuple[str, str]]:
    """A secret header's value, and its credentials alone after a scheme (``Bearer abc``)."""
    yield place, text
    scheme, space, credentials = text.strip().partition(" ")
    if space and scheme.isalpha() and credentials.strip():
        yield place, credentials.strip()


def url_secrets(url: str, *, database: bool = False) -> list[str]:
    """The secrets of a URL (of each, for NATS's comma-separated servers): the password of its
    userinfo (or, for the schemes of :data:`USER_IS_TOKEN`, the user alone), as written and
    decoded, the pair as
    ``Authorization: Basic`` carries it, the values of secret-looking query parameters, and
    for a ``database`` URL its password as SQLAlchemy reads it (which may hold ``/``, ``?``
    or ``#``)."""
    found: list[str] = []
    for part in dict.fromkeys([url, *url.split(",")]):
        parts = urlsplit(part)
        userinfo = parts.netloc.rpartition("@")[0]
        if userinfo:
            user, colon, password = userinfo.partition(":")
            token_user = parts.scheme.lower() in USER_IS_TOKEN
            secret = password if colon else (user if token_user else "")
            found += [secret, unquote(secret)]
            if colon:
                pair = f"{unquote(user)}:{unquote(password)}".encode()
                found.append(base64.b64encode(pair).decode())
        found += [
            value
            for key, value in parse_qsl(parts.query, keep_blank_values=True)
            if is_secret_name(key)
        ]
    if database:
        try:
            password = make_url(url).password
        except (ArgumentError, ValueError):
            password = None
        if password:
            found.append(str(password))
    return [secret for secret in dict.fromkeys(found) if secret]


def _join(place: str, name: str) -> str:
    return f"{place}.{name}" if place else name
