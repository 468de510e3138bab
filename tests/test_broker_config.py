"""The broker destinations' settings, name templates and message headers (no broker needed)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from standardwebhooks.webhooks import Webhook

from relay.destinations import Outbound, generate_secret, parse_destination_config
from relay.destinations.amqp_config import AmqpDestinationConfig
from relay.destinations.message_headers import MessageHeaders
from relay.destinations.templates import VALUE_LENGTH, NameTemplate
from relay.settings import SettingsError, load_settings

AMQP = {"type": "amqp", "url": "amqp://guest:guest@127.0.0.1:5672/", "exchange": "callbacks"}
NATS = {"type": "nats", "url": "nats://127.0.0.1:4222", "subject": "callbacks.{kind}.{source}"}
MQTT = {"type": "mqtt", "url": "mqtt://127.0.0.1:1883", "topic": "callbacks/{kind}/{source}"}


def outbound(
    kind: str = "conversations.status",
    source: str = "default",
    payload: dict[str, Any] | None = None,
) -> Outbound:
    return Outbound(
        event_id="01a20a53-0826-7c44-b32b-31e46ba11ceb",
        kind=kind,
        source=source,
        received_at=datetime(2026, 11, 24, 12, 0, tzinfo=UTC),
        payload={"messageId": "m-1", "event": "MessageStatus::DELIVERED"}
        if payload is None
        else payload,
        raw_body=b"{}",
        content_type="application/json",
        method="POST",
    )


def refusal(table: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_destination_config(table)
    return str(caught.value)


@pytest.mark.parametrize("table", [AMQP, NATS, MQTT], ids=["amqp", "nats", "mqtt"])
def test_the_documented_minimal_tables_are_valid(table: dict[str, Any]) -> None:
    config = parse_destination_config(table)
    assert config.type == table["type"]
    assert config.format == "envelope"
    assert config.secret == []


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@127.0.0.1:5672/?heartbeat=30",
        "amqp://h/?heartbeat=0&name=relay-worker&auth=PLAIN",
        "amqps://h/vhost?cafile=/etc/ca.pem&certfile=/c.pem&keyfile=/k.pem&no_verify_ssl=0",
        "amqps://h/?capath=/etc/ssl/certs&auth=external",
    ],
)
def test_amqp_url_takes_the_connection_parameters_the_client_reads(url: str) -> None:
    config = parse_destination_config({**AMQP, "url": url})
    assert isinstance(config, AmqpDestinationConfig) and config.url == url


def test_amqp_defaults_and_declare() -> None:
    config = parse_destination_config({**AMQP, "declare": {"queue": "platform-events"}})
    assert isinstance(config, AmqpDestinationConfig)
    assert config.routing_key == "{kind}.{source}"
    assert config.declare is not None
    assert (config.declare.exchange_type, config.declare.binding_key) == ("topic", "#")


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({**AMQP, "url": "http://127.0.0.1:5672/"}, "amqp:// or amqps://"),
        ({**AMQP, "url": ""}, "amqp:// or amqps://"),
        ({**AMQP, "url": "amqp://"}, "must name a host"),
        ({**AMQP, "url": "amqp://h:port/"}, "invalid port"),
        ({**AMQP, "url": "amqp://h /"}, "spaces or control characters"),
        ({**AMQP, "url": ["amqp://h/"]}, "valid string"),
        ({**AMQP, "url": "amqp://h/?heartbeat=abc"}, "heartbeat must be 0 to 65534"),
        ({**AMQP, "url": "amqp://h/?heartbeat=-5"}, "heartbeat must be 0 to 65534"),
        ({**AMQP, "url": "amqp://h/?heartbeat=65535"}, "heartbeat must be 0 to 65534"),
        ({**AMQP, "url": "amqp://h/?heartbeat=%C2%B2"}, "heartbeat must be 0 to 65534"),
        ({**AMQP, "url": "amqp://h/?heartbeat=30&heartbeat=0"}, "'heartbeat' is given twice"),
        ({**AMQP, "url": "amqp://h/?heartbeat="}, "'heartbeat' needs a printable value"),
        ({**AMQP, "url": "amqp://h/?name=%00"}, "'name' needs a printable value"),
        ({**AMQP, "url": "amqp://h/?heartbeat"}, "name=value pairs"),
        ({**AMQP, "url": "amqp://h/?timeout=5"}, "'timeout' is not one of heartbeat, name"),
        ({**AMQP, "url": "amqp://h/?" + "x" * 10_000 + "=1"}, "is not one of"),
        ({**AMQP, "url": "amqp://h/?cafile=/ca.pem"}, "'cafile' needs an amqps:// url"),
        ({**AMQP, "url": "amqps://h/?no_verify_ssl=yes"}, "no_verify_ssl must be 0 or 1"),
        ({**AMQP, "url": "amqps://h/?keyfile=/k.pem"}, "keyfile needs certfile"),
        ({**AMQP, "url": "amqps://h/?auth=gssapi"}, "auth must be one of plain"),
        ({**AMQP, "url": "amqps://h/?auth=amqplain"}, "auth must be one of plain, external"),
        ({**AMQP, "url": "amqp://h/?heartbeat=" + "9" * 5000}, "heartbeat must be 0 to 65534"),
        ({**AMQP, "url": "amqp://h/?heartbeat=000030"}, "heartbeat must be 0 to 65534"),
        ({**AMQP, "url": "amqp://h/?name=" + "n" * 256}, "name must be at most 255"),
        ({**AMQP, "exchange": "x" * 128}, "at most 127 characters"),
        ({**AMQP, "exchange": "a\nb"}, "at most 127 characters"),
        ({**AMQP, "exchange": "événements"}, "at most 127 characters"),
        ({**AMQP, "declare": {"queue": "q'uote"}}, "at most 127 characters"),
        ({**AMQP, "declare": {"binding_key": "a\x00"}}, "binding_key must be printable"),
        ({**AMQP, "routing_key": ""}, "cannot be empty"),
        ({**AMQP, "routing_key": "{kind}" * 40}, "over the limit of 255"),
        ({**AMQP, "exchange": "", "declare": {}}, "declare needs a named exchange"),
        ({**AMQP, "declare": {"queue": "amq.mine"}}, "reserved"),
        ({**AMQP, "declare": {"exchange_type": "x-custom"}}, "exchange_type"),
        ({**AMQP, "declare": {"what": 1}}, "Extra inputs"),
        ({**NATS, "url": "amqp://h"}, "nats:// or tls://"),
        ({**NATS, "url": "tls://us%ZZer@h"}, "'%' that is not an escape"),
        ({**NATS, "url": "tls://u:Secret%@h"}, "'%' that is not an escape"),
        ({**NATS, "url": "tls://u:%FF%FEsecret@h"}, "not UTF-8 text"),
        ({**NATS, "url": "tls://u:Secret%00pw@h"}, "control characters, even escaped"),
        ({**NATS, "url": "tls://@h"}, "without a user (or token)"),
        ({**NATS, "url": "nats://:pw@h"}, "without a user (or token)"),
        ({**AMQP, "url": "amqp://gu%0Aest:guest@h/"}, "control characters, even escaped"),
        ({**AMQP, "url": "amqp://:guest@h/"}, "without a user (or token)"),
        ({**MQTT, "url": "mqtt://u:p%E9@h"}, "not UTF-8 text"),
        ({**MQTT, "url": "mqtts://u%@h"}, "'%' that is not an escape"),
        ({**NATS, "url": "nats://h?x=1"}, "query or a fragment"),
        ({**NATS, "subject": "a.*"}, "cannot hold '*'"),
        ({**NATS, "subject": "a.>"}, "cannot hold '>'"),
        ({**NATS, "subject": "a b"}, "cannot hold ' '"),
        ({**NATS, "subject": "a..{kind}"}, "'..'"),
        ({**NATS, "subject": "{kind}."}, "'..'"),
        ({**NATS, "subject": "$JS.API.{kind}"}, "the server's own"),
        ({**MQTT, "topic": "a/+/b"}, "cannot hold '+'"),
        ({**MQTT, "topic": "a/#"}, "cannot hold '#'"),
        ({**MQTT, "topic": "$SYS/x"}, "broker's own"),
        ({**MQTT, "topic": "a\x00b"}, "control characters"),
        ({**MQTT, "qos": 0}, "qos"),
        ({**MQTT, "qos": "1"}, "qos"),
        ({**MQTT, "client_id_prefix": "é"}, "printable ASCII"),
        ({**MQTT, "client_id_prefix": "x" * 49}, "at most 48"),
        ({**MQTT, "topic": "a/{nope}"}, "{nope} is not a template field"),
        ({**MQTT, "topic": "a/{kind:>10}"}, "formats and conversions are not supported"),
        ({**MQTT, "topic": "a/{kind!r}"}, "formats and conversions are not supported"),
        ({**MQTT, "topic": "a/{}"}, "is not a template field"),
        ({**MQTT, "topic": "a/{"}, "not a valid template"),
        ({**MQTT, "secret": "not-a-secret"}, "whsec_"),
        ({**MQTT, "format": "xml"}, "format"),
        ({"type": "kafka", "bootstrap_servers": "h:9092"}, "type 'kafka' is not a destination"),
    ],
)
def test_bad_values_are_refused_naming_the_problem(table: dict[str, Any], expected: str) -> None:
    assert expected in refusal(table)


@pytest.mark.parametrize(
    ("table", "missing"),
    [
        (AMQP, "url"),
        (AMQP, "exchange"),
        (NATS, "url"),
        (NATS, "subject"),
        (MQTT, "url"),
        (MQTT, "topic"),
    ],
)
def test_required_keys(table: dict[str, Any], missing: str) -> None:
    assert "Field required" in refusal({k: v for k, v in table.items() if k != missing})


def test_a_bad_url_never_shows_its_password_in_the_settings_error(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        '[destinations.bus]\ntype = "amqp"\nexchange = "x"\n'
        'url = "amqp://guest:s3cret-pw@h:nope/"\n'
    )
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    assert "s3cret-pw" not in str(caught.value)
    assert "destinations.bus.amqp.url: Value error, url has an invalid port" in str(caught.value)


def test_templates_render_each_field() -> None:
    template = NameTemplate("cb.{kind}.{source}.{event}.{platform_id}.{id}")
    assert template.render(outbound()) == (
        "cb.conversations.status.default.messagestatus__delivered.m-1."
        "01a20a53-0826-7c44-b32b-31e46ba11ceb"
    )


def test_payload_values_cannot_add_separators_wildcards_or_length() -> None:
    hostile = {"messageId": "a.b/*>#+ é" + "x" * 100, "event": "../$SYS"}
    name = NameTemplate("{platform_id}.{event}.{source}").render(
        outbound(source="a b.c/#", payload=hostile)
    )
    platform_id, event, source = name.split(".")
    assert platform_id.startswith("a_b_______xx")
    assert len(platform_id) == VALUE_LENGTH
    assert (event, source) == ("____sys", "a_b_c__")


@pytest.mark.parametrize(
    "payload", [{}, {"messageId": None, "event": 5}, {"messageId": {"x": 1}, "event": ""}]
)
def test_absent_or_unfit_values_render_as_none(payload: dict[str, Any]) -> None:
    rendered = NameTemplate("{platform_id}.{event}").render(outbound(payload=payload))
    first, second = rendered.split(".")
    assert first == "none"
    assert second in ("none", "5")


def test_brace_escapes_are_literal_text() -> None:
    assert NameTemplate("a{{b}}.{kind}").render(outbound(kind="sms.dlr")) == "a{b}.sms.dlr"


def test_headers_carry_ids_kind_source_event_and_a_verifiable_signature() -> None:
    secret = generate_secret()
    event = outbound()
    body = b'{"hello":"world"}'
    now = int(time.time())
    headers = MessageHeaders([secret], clock=lambda: now).for_message(
        event, body, "application/json"
    )
    assert headers["webhook-id"] == event.event_id
    assert headers["webhook-timestamp"] == str(now)
    assert (headers["kind"], headers["source"], headers["event"]) == (
        "conversations.status",
        "default",
        "messagestatus::delivered",
    )
    assert headers["content-type"] == "application/json"
    Webhook(secret).verify(body, headers)


def test_headers_without_secret_or_event_and_with_control_characters() -> None:
    event = outbound(kind="sms.inbound", source="a\r\nb", payload={"requestId": "r"})
    headers = MessageHeaders([]).for_message(event, b"", None)
    assert "webhook-signature" not in headers
    assert "event" not in headers
    assert "content-type" not in headers
    assert headers["source"] == "a__b"


def test_a_signature_over_a_body_that_is_not_utf8_verifies_by_hmac() -> None:
    secret = generate_secret()
    headers = MessageHeaders([secret]).for_message(outbound(), b"\xff\xfe", None)
    assert headers["webhook-signature"].startswith("v1,")


def test_configuring_a_broker_loads_its_client_only_when_built() -> None:
    parse_destination_config(AMQP)
    parse_destination_config(NATS)
    parse_destination_config(MQTT)
    assert not {"aio_pika", "nats", "aiomqtt", "paho"} & _loaded_by_a_fresh_import()


def _loaded_by_a_fresh_import() -> set[str]:
    """The broker clients a fresh interpreter loads when it imports the settings and the relay."""
    import subprocess

    code = (
        "import sys, relay.settings, relay.destinations, relay.server.services,"
        " relay.server.runtime;"
        "print(' '.join(m for m in ('aio_pika', 'nats', 'aiomqtt', 'paho') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(found.stdout.split())


def test_a_legacy_report_names_and_heads_by_its_msgid_and_stat() -> None:
    """A legacy SMS report has ``msgid``/``stat`` where the current one has
    ``requestId``/``status``: its platform id and event come from its own row of the kind."""
    legacy = outbound("sms.dlr", payload={"msgid": "m-7", "stat": "DELIVRD", "to": "49151"})
    assert NameTemplate("{platform_id}.{event}").render(legacy) == "m-7.delivrd"
    assert MessageHeaders([]).for_message(legacy, b"{}", None)["event"] == "delivrd"
