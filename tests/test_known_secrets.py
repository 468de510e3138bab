"""Every secret the settings hold is masked wherever it appears in a printed line, in every form
it may be printed in; a secret too short to be masked safely is named instead; the settings
have no secret field that the collection could miss."""

from __future__ import annotations

import base64
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relay.observe.known_secrets import MIN_MASKED_LENGTH, KnownSecrets, known_secrets, url_secrets
from relay.observe.log_redaction import is_secret_name
from relay.settings import Settings
from tests.secrets_support import (
    Services,
    config_toml,
    postgres_url,
    printed_forms,
    random_secrets,
)
from tests.support import Sink

SECRET = "s3cret-Value-0123456789"


def configuration(values: dict[str, str]) -> dict[str, Any]:
    """The acceptance test's configuration (scaled: PostgreSQL and Redis) as a table."""
    sink = Sink()
    sink.base_url = "http://127.0.0.1:9"
    services = Services(
        sink,
        f"redis://:{values['redis_password']}@127.0.0.1:6379/0",
        "vhost",
        "relay",
        "stream",
        "root",
        postgres_url(values, "relay"),
    )
    return tomllib.loads(config_toml(values, services, Path("/tmp")))


def test_every_configured_secret_is_masked_in_every_printed_form() -> None:
    values = random_secrets()
    known = known_secrets(Settings(**configuration(values)))
    for place, secret in values.items():
        for form in printed_forms(secret):
            assert known.mask(f"<{form}>") == "<***>", (place, form)
    pair = base64.b64encode(f"ops:{values['basic_auth_password']}".encode()).decode()
    assert known.mask(f"Authorization: Basic {pair}") == "Authorization: Basic ***"
    assert known.too_short == ()


def schema_secret_places(schema: dict[str, Any]) -> set[str]:
    """The places of the settings' JSON schema that hold secrets: ``SecretStr`` fields (a
    ``password`` format), URLs (``url``, ``*_url``) and destination headers; ``*`` for a
    table's key or a list's index, ``<type>`` for a tagged union's member."""
    definitions = schema.get("$defs", {})
    places: set[str] = set()

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        if "$ref" in node:
            node = definitions[node["$ref"].rpartition("/")[2]]
        if node.get("format") == "password":
            places.add(".".join(path))
        for option in node.get("anyOf", []) + node.get("oneOf", []):
            tag = option.get("$ref", "") and definitions[option["$ref"].rpartition("/")[2]]
            const = tag and tag["properties"].get("type", {}).get("const")
            walk(option, (*path, f"<{const}>") if const else path)
        for name, field in node.get("properties", {}).items():
            if name == "url" or name.endswith("_url") or name == "headers":
                places.add(".".join((*path, name)))
            walk(field, (*path, name))
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], (*path, "*"))

    walk(schema, ())
    return places


def data_places(value: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    """The places a configuration gives a value to, named as :func:`schema_secret_places`."""
    yield ".".join(path)
    if isinstance(value, dict):
        for key, item in value.items():
            tag = (f"<{item['type']}>",) if isinstance(item, dict) and "type" in item else ()
            known = key in Settings.model_fields or not path or path[-1] not in SCHEMA_TABLES
            yield from data_places(item, (*path, key if known else "*", *tag))
    elif isinstance(value, list):
        for item in value:
            yield from data_places(item, (*path, "*"))


SCHEMA_TABLES = ("sources", "destinations", "policies", "users", "headers")
"""Tables whose keys are the user's names (``*`` in a schema's places)."""


def test_the_configuration_fills_every_secret_place_of_the_settings() -> None:
    """A secret field added to the settings fails here until the configuration of the tests
    (so the acceptance test) gives it a secret and sees it masked."""
    wanted = {
        place.removesuffix(".*") for place in schema_secret_places(Settings.model_json_schema())
    }
    filled = {place.removesuffix(".*") for place in data_places(configuration(random_secrets()))}
    assert wanted - filled == set()  # a list may be given as its one string


def test_every_field_named_like_a_secret_holds_secret_strings() -> None:
    """A field whose name says it holds a secret is a ``SecretStr`` (or a list or table of
    them), which :func:`known_secrets` collects wherever it is."""
    schema = Settings.model_json_schema()
    secret_places = schema_secret_places(schema)
    named = set()
    for definition in [schema, *schema["$defs"].values()]:
        named |= {name for name in definition.get("properties", {}) if is_secret_name(name)}
    assert {"token", "secret", "signature_secret"} <= named
    for name in named:
        assert any(f".{name}." in f".{place}." for place in secret_places), name


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        (f"http://svc:{SECRET}@host/in", {SECRET}),
        (f"nats://{SECRET}@host:4222", {SECRET}),
        (f"redis://:{SECRET}@host/0", {SECRET}),
        ("mqtt://u:p%2Fw%40rd-long@host", {"p%2Fw%40rd-long", "p/w@rd-long"}),
        (f"nats://a:{SECRET}@h1:4222,nats://a:{SECRET}x@h2:4222", {SECRET, f"{SECRET}x"}),
        (f"http://host/in?token={SECRET}&api_key={SECRET}2&name=x", {SECRET, f"{SECRET}2"}),
        ("http://host:8080/in?email=a@b.example", set()),
    ],
)
def test_a_urls_password_token_and_query_secrets_are_collected(url: str, secrets: set[str]) -> None:
    found = set(url_secrets(url))
    assert secrets <= found
    assert not any(word in found for word in ("svc", "a", "u", "x", "host", "name"))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://relay@db.internal/relay",  # README's own example
        "postgresql://nobody@127.0.0.1:1/x",
        "amqp://relay-user@rabbit/",
        "http://svc@host/in",
        "mqtt://device@broker",
    ],
)
def test_a_user_alone_is_a_name_not_a_secret_outside_nats_and_redis(url: str) -> None:
    assert url_secrets(url, database=url.startswith("postgresql")) == []
    settings = Settings(database_url=url) if url.startswith("postgresql") else None
    if settings is not None:  # and nothing to warn about at start
        assert known_secrets(settings).too_short == ()


def test_a_database_password_is_read_as_sqlalchemy_reads_it() -> None:
    url = f"postgresql://relay:{SECRET}/?#@db.internal/relay"
    assert f"{SECRET}/?#" in url_secrets(url, database=True)
    assert f"{SECRET}/?#" not in url_secrets(url)


def test_a_secret_too_short_to_mask_safely_is_named_and_left_alone() -> None:
    settings = Settings(
        destinations={
            "rabbit": {"type": "amqp", "url": "amqp://guest:guest@host/", "exchange": "x"},
            "crm": {"type": "http", "url": f"http://svc:{SECRET}@host/"},
        }
    )
    known = known_secrets(settings)
    assert known.too_short == ("destinations.rabbit.url",)
    assert known.mask("the guest user, the password 'guest'") == (
        "the guest user, the password 'guest'"
    )
    assert known.mask(f"pw {SECRET}") == "pw ***"
    assert len("guest") < MIN_MASKED_LENGTH <= len(SECRET)


def test_a_secret_header_is_collected_and_another_is_not() -> None:
    settings = Settings(
        destinations={
            "crm": {
                "type": "http",
                "url": "http://host/",
                "headers": {
                    "Authorization": f"Bearer {SECRET}",
                    "X-Api-Key": f"{SECRET}-2",
                    "X-Tenant": "acme-production",
                },
            }
        }
    )
    known = known_secrets(settings)
    assert known.mask(f"{SECRET} {SECRET}-2 acme-production") == "*** *** acme-production"


def test_secrets_added_later_are_masked_and_the_longest_first() -> None:
    known = KnownSecrets([SECRET])
    known.add(None, "short", f"{SECRET}-and-more")
    assert known.mask(f"a {SECRET}-and-more b {SECRET} c short") == "a *** b *** c short"


def test_a_megabyte_of_near_misses_is_masked_in_one_pass() -> None:
    known = KnownSecrets([SECRET])
    near = SECRET[:-1] + "!"
    assert known.mask((near + SECRET) * 40_000) == (near + "***") * 40_000
