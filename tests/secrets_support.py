"""What the tests of secrets in the output share: a distinct random secret for every place of
the settings that takes one, a configuration holding them all, and the forms a secret may be
printed in (to look for each)."""

from __future__ import annotations

import base64
import json
import re
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, quote_plus

from relay.destinations.signing import generate_secret
from tests.amqp_support import AMQP_BASE_URL
from tests.mqtt_support import MQTT_URL
from tests.nats_support import NATS_URL
from tests.support import Sink, free_port

PLACES = (
    "source_token",
    "source_token_rotated",
    "basic_auth_password",
    "header_value",
    "signature_secret",
    "console_password",
    "http_password",
    "http_query_token",
    "http_query_api_key",
    "http_header_bearer",
    "http_whsec",
    "failing_password",
    "failing_query_password",
    "refused_password",
    "refused_query_sig",
    "redis_password",
    "wrong_redis_password",
    "amqp_password",
    "wrong_amqp_password",
    "nats_password",
    "nats_token",
    "mqtt_password",
    "amqp_whsec",
    "nats_whsec",
    "mqtt_whsec",
    "database_password",
)
"""Every place of the settings where a user writes a secret (the run fills each with its own)."""


def random_secrets() -> dict[str, str]:
    """A distinct random secret per place, of 24 characters or more; the HTTP password holds
    characters a URL escapes, the database's those that SQLAlchemy takes in a password as
    written (and that end a URL's userinfo for any other parser)."""
    values = {place: secrets.token_urlsafe(18) for place in PLACES}
    values["http_password"] += "/@:!é"
    values["database_password"] += "/?#"
    for place in ("http_whsec", "amqp_whsec", "nats_whsec", "mqtt_whsec"):
        values[place] = generate_secret()
    return values


FRAGMENT = 12
"""A secret's first or last this many characters, printed alone, are a leak too (random, they
appear nowhere else): a URL cut short at a character of the password shows its start."""


def printed_forms(secret: str) -> set[str]:
    """What a secret may look like once printed: as is, percent-encoded (either hex case, ``+``
    or ``%20`` for a space), escaped in a JSON string or a Python repr, and for a ``whsec_``
    secret its key alone."""
    encoded = {quote(secret, safe=""), quote(secret), quote_plus(secret, safe="")}
    forms = {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], *encoded}
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), form) for form in encoded}
    return forms | {secret.removeprefix("whsec_")}


def fragments(secret: str) -> set[str]:
    """The first and last :data:`FRAGMENT` characters of a secret (and of a ``whsec_`` key)."""
    whole = {secret, secret.removeprefix("whsec_")}
    return {part for text in whole for part in (text[:FRAGMENT], text[-FRAGMENT:])}


def leaks(text: str, values: dict[str, str], *, basic: tuple[str, str]) -> list[str]:
    """The places whose secret ``text`` holds, in any printed form or a fragment, and the
    basic-auth pair ``basic`` as its header carries it."""
    found = [
        place
        for place, secret in values.items()
        if any(form in text for form in printed_forms(secret) | fragments(secret))
    ]
    pair = base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()
    return found + (["basic_auth (base64)"] if pair in text else [])


def postgres_url(values: dict[str, str], database: str) -> str:
    """A PostgreSQL URL of the machine's server (trust: any password goes) with the run's
    database password, as SQLAlchemy reads it (written as is)."""
    return f"postgresql://postgres:{values['database_password']}@127.0.0.1:5432/{database}"


@dataclass
class Services:
    """What a run's destinations and stores talk to, each with a secret of the run's."""

    sink: Sink
    redis_url: str
    vhost: str
    amqp_user: str
    nats_stream: str
    mqtt_root: str
    database_url: str | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)


def destinations_toml(values: dict[str, str], services: Services) -> str:
    """Every destination type, with secrets in URLs (userinfo and query), signing secrets and a
    header; ``failing`` is answered 500, ``refused`` is refused, and ``stream_denied`` and
    ``rabbit_denied`` have a wrong password."""
    sink = services.sink.base_url.removeprefix("http://")
    redis = services.redis_url.rpartition("@")[2].rsplit("/", 1)[0]
    amqp_host = AMQP_BASE_URL.rpartition("@")[2].rstrip("/")
    nats_host = NATS_URL.removeprefix("nats://")
    mqtt_host = MQTT_URL.removeprefix("mqtt://")
    http_password = quote(values["http_password"], safe="")
    return f"""
[destinations.crm]
type = "http"
url = "http://svc:{http_password}@{sink}/in?token={values["http_query_token"]}&api_key={values["http_query_api_key"]}"
secret = "{values["http_whsec"]}"
headers = {{Authorization = "Bearer {values["http_header_bearer"]}"}}

[destinations.failing]
type = "http"
url = "http://svc:{values["failing_password"]}@{sink}/fail?password={values["failing_query_password"]}"

[destinations.refused]
type = "http"
url = "http://svc:{values["refused_password"]}@127.0.0.1:{free_port()}/in?sig={values["refused_query_sig"]}"
timeout = "2s"

[destinations.stream]
type = "redis-stream"
url = "redis://:{values["redis_password"]}@{redis}/1"
stream = "secrets"

[destinations.stream_denied]
type = "redis-stream"
url = "redis://:{values["wrong_redis_password"]}@{redis}/1"
stream = "secrets"

[destinations.queue]
type = "arq"
url = "redis://:{values["redis_password"]}@{redis}/2"
function = "handle"

[destinations.rabbit]
type = "amqp"
url = "amqp://{services.amqp_user}:{values["amqp_password"]}@{amqp_host}/{services.vhost}?name=secrets"
exchange = "secrets"
declare = {{queue = "secrets"}}
secret = "{values["amqp_whsec"]}"

[destinations.rabbit_denied]
type = "amqp"
url = "amqp://{services.amqp_user}:{values["wrong_amqp_password"]}@{amqp_host}/{services.vhost}"
exchange = "amq.topic"

[destinations.jetstream]
type = "nats"
url = "nats://relay:{values["nats_password"]}@{nats_host}"
subject = "{services.nats_stream}.{{kind}}"
secret = "{values["nats_whsec"]}"

[destinations.jetstream_token]
type = "nats"
url = "nats://{values["nats_token"]}@{nats_host}"
subject = "{services.nats_stream}.token.{{kind}}"

[destinations.mqtt]
type = "mqtt"
url = "mqtt://relay:{values["mqtt_password"]}@{mqtt_host}"
topic = "{services.mqtt_root}/{{kind}}"
secret = "{values["mqtt_whsec"]}"
"""


def config_toml(values: dict[str, str], services: Services, tmp_path: Path) -> str:
    """A configuration with a secret of ``values`` in every place that takes one."""
    if services.database_url is None:
        store = f'database_url = "sqlite:///{tmp_path / "relay.db"}"\n'
    else:
        store = (
            f'database_url = "{services.database_url}"\n'
            f'redis_url = "redis://:{values["redis_password"]}@'
            f'{services.redis_url.rpartition("@")[2]}"\n'
        )
    return f"""{store}
[sources.default]
token = ["{values["source_token"]}", "{values["source_token_rotated"]}"]

[sources.basic]
basic_auth = "ops:{values["basic_auth_password"]}"

[sources.chat]
signature_secret = "{values["signature_secret"]}"
header = {{name = "X-Callback-Key", value = "{values["header_value"]}"}}

[console.users]
ops = "{values["console_password"]}"
{destinations_toml(values, services)}"""
