"""Order keys: the default per kind, templates over the payload, and what the settings refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from relay.destinations import parse_destination_config
from relay.outbox.order_keys import OrderKey
from relay.settings import SettingsError, load_settings
from relay.simulator import factories

HTTP = {"type": "http", "url": "http://127.0.0.1:9/hook", "ordering": "per-key"}


def key_of(table: dict[str, Any], kind: str, payload: dict[str, Any]) -> str | None:
    return parse_destination_config(table).order_key_of(kind, "default", payload)


@pytest.mark.parametrize(
    ("kind", "payload", "field"),
    [
        ("sms.dlr", factories.sms_dlr(), "requestId"),
        ("sms.dlr", factories.sms_dlr_legacy(), "msgid"),
        ("sms.inbound", factories.sms_inbound(), "requestId"),
        ("numinfo.gnp", factories.numinfo_gnp(), "requestId"),
        ("numinfo.gnv", factories.numinfo_gnv(), "requestId"),
        ("conversations.status", factories.conversations_status(), "messageId"),
        ("conversations.inbound", factories.conversations_inbound(), "messageId"),
        ("conversations.event", factories.conversations_event({"messageId": "m-9"}), "messageId"),
        ("tts.event", factories.tts_event(), "callId"),
    ],
)
def test_the_default_key_is_the_platform_id_of_each_kind(
    kind: str, payload: dict[str, Any], field: str
) -> None:
    assert payload[field]
    assert key_of(HTTP, kind, payload) == str(payload[field])


def test_a_call_event_of_conversations_has_no_message_id_so_no_key() -> None:
    payload = factories.conversations_event()  # Call::started: about a call, not a message
    assert "messageId" not in payload
    assert key_of(HTTP, "conversations.event", payload) is None


def test_without_per_key_ordering_there_is_no_key() -> None:
    table = {**HTTP, "ordering": "none"}
    assert key_of(table, "sms.dlr", factories.sms_dlr()) is None
    assert (
        key_of({"type": "http", "url": "http://127.0.0.1:9/"}, "sms.dlr", {"requestId": "r"})
        is None
    )


def test_templates_join_envelope_and_payload_fields() -> None:
    table = {**HTTP, "order_key": "{source}/{kind}/{payload.to}:{platform_id}"}
    payload = {"requestId": "r1", "status": "DELIVERED", "to": 4915112345678}
    assert key_of(table, "sms.dlr", payload) == "default/sms.dlr/4915112345678:r1"
    assert key_of({**HTTP, "order_key": "everything"}, "sms.dlr", payload) == "everything"
    assert key_of({**HTTP, "order_key": "{{literal}}"}, "sms.dlr", payload) == "{literal}"


@pytest.mark.parametrize("value", [None, "", {"a": 1}, [1, 2]])
def test_an_event_without_a_usable_value_has_no_key(value: Any) -> None:
    table = {**HTTP, "order_key": "{payload.to}"}
    payload = {"requestId": "r1", "status": "DELIVERED"}
    if value is not None:
        payload["to"] = value
    assert key_of(table, "sms.dlr", payload) is None
    assert key_of(HTTP, "sms.dlr", {"status": "DELIVERED", "requestId": value}) is None


@pytest.mark.parametrize("value", ["x" * 201, "x" * 600, "tab\there", "nul\x00", "\u2028line"])
@pytest.mark.parametrize("template", ["{payload.to}", "{platform_id}"])
def test_long_or_unprintable_keys_are_stored_as_their_hash(template: str, value: str) -> None:
    """Also the default key: a requestId the receivers do not keep as a searchable platform id
    (too long, unprintable) still orders its events."""
    payload = {"to": value, "requestId": value, "status": "DELIVERED"}
    key = OrderKey(template).key("sms.dlr", "default", payload)
    assert key is not None and key.startswith("sha256:") and len(key) == 71
    other = {**payload, "to": value + "!", "requestId": value + "!"}
    assert key != OrderKey(template).key("sms.dlr", "default", other)


@pytest.mark.parametrize(
    ("value", "key"),
    [(True, "true"), (False, "false"), (7, "7"), (1.5e308, "1.5e+308"), ("True", "True")],
)
def test_numbers_and_booleans_are_their_json_text(value: Any, key: str) -> None:
    assert OrderKey("{payload.to}").key("sms.dlr", "default", {"to": value}) == key


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"ordering": "PER-KEY"}, "Input should be 'none' or 'per-key'"),
        ({"ordering": ""}, "Input should be 'none' or 'per-key'"),
        ({"ordering": 1}, "Input should be 'none' or 'per-key'"),
        ({"ordering": ["per-key"]}, "Input should be 'none' or 'per-key'"),
        ({"order_key": 5}, "Input should be a valid string"),
        ({"order_key": ["{platform_id}"]}, "Input should be a valid string"),
        ({"order_key": ""}, "order_key: cannot be empty"),
        ({"order_key": "x" * 501}, "at most 500 characters"),
        ({"order_key": "{to}"}, "{to} is not a template field"),
        ({"order_key": "{payload.}"}, "{payload.} is not a template field"),
        ({"order_key": "{payload.a.b}"}, "{payload.a.b} is not a template field"),
        ({"order_key": "{payload.to[0]}"}, "is not a template field"),
        ({"order_key": "{}"}, "{} is not a template field"),
        ({"order_key": "{0}"}, "{0} is not a template field"),
        ({"order_key": "{platform_id!r}"}, "'{platform_id!r}': formats and conversions are"),
        ({"order_key": "{kind:>9}"}, "'{kind:>9}': formats and conversions are not supported"),
        ({"order_key": "{platform_id"}, "is not a valid template"),
        ({"order_key": "platform_id}"}, "is not a valid template"),
        (
            {"ordering": "none", "order_key": "{platform_id}"},
            'order_key needs ordering = "per-key"',
        ),
    ],
)
def test_bad_ordering_settings_are_refused_naming_the_problem(
    change: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_destination_config({**HTTP, **change})
    assert expected in str(caught.value)


def test_a_settings_file_with_a_bad_order_key_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        '[destinations.crm]\ntype = "http"\nurl = "http://127.0.0.1:9/"\n'
        'ordering = "per-key"\norder_key = "{payload.to"\n'
    )
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    assert "destinations.crm.http" in str(caught.value) and "order_key" in str(caught.value)
