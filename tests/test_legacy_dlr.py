"""Delivery reports of the platform's older SMS interface (GET query parameters ``msgid``,
``stat``, ...) at the sms.dlr URL: stored as ``sms.dlr`` with their own field names, deduplicated
on msgid + stat, and protected like any other callback."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from openapi_spec_validator import validate
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers import ReceiverConfig, SourceConfig
from receivers.kinds import KINDS, KINDS_BY_NAME, kind_for, kinds_by_path
from receivers.openapi import openapi_document
from receivers.payloads.sms import DeliveryReport, LegacyDeliveryReport
from receivers.store import queries
from relay.simulator import factories
from tests.conftest import TOKEN, ClientFactory
from tests.metrics_support import sample

REPORT = {
    "receiver": "+4915112345678",
    "msgid": "5e8f0c1a-legacy-0001",
    "ttid": "26201",
    "mccmnc": "26201",
    "err": "000",
    "stat": "delivered",
    "sender": "ACME",
    "text": "Your code is 0042",
    "donedate": "1767225620",
    "submitdate": "1767225600",
    "price": "0.0450",
    "currency": "EUR",
    "priceEffective": "2026-01-01",
}
"""A legacy report as the platform sends it (every value text, prices and ids as written)."""


async def _get(client: httpx.AsyncClient, params: dict[str, str], path: str = "/hooks") -> Any:
    return await client.get(f"{path}/sms/dlr?token={TOKEN}&{urlencode(params)}")


@pytest.mark.slow
async def test_get_report_is_stored_as_sms_dlr_with_its_own_fields(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    answer = await _get(client, REPORT)

    assert answer.status_code == 200, answer.text
    assert answer.json()["kind"] == "sms.dlr"
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None and stored.kind == "sms.dlr" and stored.method == "GET"
    assert stored.payload == REPORT  # names and values exactly as received
    assert stored.raw_body == urlencode(REPORT).encode()
    assert stored.dedup_key == f"{REPORT['msgid']}|delivered"


@pytest.mark.slow
async def test_post_json_report_is_stored_with_numbers_as_their_text(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = {**REPORT, "stat": "Not Delivered", "ttid": 26201, "err": 1, "price": 0.045}
    body |= {"submitdate": 1767225600, "futureField": {"kept": True}}
    answer = await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=body)

    assert answer.status_code == 200, answer.text
    stored = await queries.get_event(engine, answer.json()["id"])
    assert stored is not None and stored.kind == "sms.dlr" and stored.method == "POST"
    assert stored.payload == {
        **body,
        "ttid": "26201",
        "err": "1",
        "price": "0.045",
        "submitdate": "1767225600",
    }
    assert stored.dedup_key == f"{REPORT['msgid']}|not delivered"


async def test_same_msgid_and_stat_is_a_duplicate_and_another_stat_a_new_event(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    first = await _get(client, {**REPORT, "stat": "buffered"})
    retried = await _get(client, {**REPORT, "stat": "buffered"})
    other_case = await client.post(
        f"/hooks/sms/dlr?token={TOKEN}", json={**REPORT, "stat": "BUFFERED"}
    )
    delivered = await _get(client, REPORT)
    delivered_again = await _get(client, {**REPORT, "donedate": "1767225621"})

    assert {a.status_code for a in (first, retried, other_case, delivered)} == {200}
    assert retried.json() == first.json() == other_case.json()
    assert delivered.json()["id"] != first.json()["id"]
    assert delivered_again.json() == delivered.json()
    events = {e.id: e for e in await queries.list_events(engine)}
    assert len(events) == 2
    assert events[first.json()["id"]].duplicates == 2
    assert events[first.json()["id"]].payload["stat"] == "buffered"  # the first, as received
    assert events[delivered.json()["id"]].duplicates == 1


@pytest.mark.slow
async def test_a_token_protected_source_needs_the_token(
    make_client: ClientFactory, engine: AsyncEngine
) -> None:
    default_token, eu_token = "default-source-token-0001", "eu-source-token-0000001"
    sources = {"default": SourceConfig(token=default_token), "eu": SourceConfig(token=eu_token)}
    query = urlencode(REPORT)
    async with make_client(sources) as client:
        missing = await client.get(f"/hooks/eu/sms/dlr?{query}")
        wrong = await client.get(f"/hooks/eu/sms/dlr?token={default_token}&{query}")
        default_missing = await client.get(f"/hooks/sms/dlr?{query}")
        stored = await client.get(f"/hooks/eu/sms/dlr?token={eu_token}&{query}")

    assert (missing.status_code, wrong.status_code, default_missing.status_code) == (401,) * 3
    assert stored.status_code == 200, stored.text
    [event] = await queries.list_events(engine)
    assert event.source == "eu" and event.kind == "sms.dlr" and event.payload == REPORT
    kept = await queries.get_event(engine, event.id)
    assert kept is not None and b"token" not in kept.raw_body
    assert await queries.list_rejected(engine) == []


@pytest.mark.slow
async def test_current_reports_still_use_the_current_model(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    current = factories.sms_dlr(status="DELIVERED")
    both = {**current, "msgid": "m-1", "stat": "delivered"}  # requestId decides
    answers = [
        await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=current),
        await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=both),
    ]

    assert [a.status_code for a in answers] == [200, 200], answers[1].text
    assert answers[0].json() == answers[1].json()  # one event: requestId + status
    stored = await queries.get_event(engine, answers[0].json()["id"])
    assert stored is not None and stored.dedup_key == f"{current['requestId']}|delivered"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("params", "field"),
    [({"msgid": "m-1", "err": "0"}, "stat"), ({"stat": "delivered"}, "msgid")],
)
async def test_a_legacy_report_without_its_key_is_422_naming_the_field(
    client: httpx.AsyncClient, engine: AsyncEngine, params: dict[str, str], field: str
) -> None:
    answer = await _get(client, params)

    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == [field]
    [rejected] = await queries.list_rejected(engine)
    assert rejected.kind == "sms.dlr"


@pytest.mark.slow
async def test_legacy_reports_are_counted_as_sms_dlr(client: httpx.AsyncClient) -> None:
    await _get(client, REPORT)
    await _get(client, REPORT)
    metrics = (await client.get("/metrics")).text
    for outcome in ("stored", "duplicate"):
        labels = {"source": "default", "kind": "sms.dlr", "outcome": outcome}
        assert sample(metrics, "relay_callbacks_total", **labels) == 1


def test_the_kind_table_has_one_canonical_row_per_kind() -> None:
    assert KINDS_BY_NAME["sms.dlr"].model is DeliveryReport
    assert [k.model for k in kinds_by_path()["/sms/dlr"]] == [LegacyDeliveryReport, DeliveryReport]
    assert kind_for("sms.dlr", REPORT).model is LegacyDeliveryReport
    assert kind_for("sms.dlr", factories.sms_dlr()).model is DeliveryReport
    for variant in (kind for kind in KINDS if kind.variant):
        canonical = KINDS_BY_NAME[variant.name]
        assert KINDS.index(variant) < KINDS.index(canonical)  # dispatch tries it first
        assert set(variant.paths) <= set(canonical.paths)
        assert variant.default_policy == canonical.default_policy


def test_openapi_describes_both_shapes_once_per_kind() -> None:
    document = openapi_document(ReceiverConfig(sources={"default": SourceConfig(token=TOKEN)}))
    validate(document)
    dlr = document["paths"]["/hooks/sms/dlr"]
    parameters = {p["name"]: p for p in dlr["get"]["parameters"]}
    assert {"requestId", "status", "msgid", "stat", "receiver", "submitdate"} <= set(parameters)
    assert not parameters["msgid"]["required"] and not parameters["requestId"]["required"]
    assert parameters["token"]["required"]
    refs = dlr["post"]["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in refs] == ["LegacyDeliveryReport", "DeliveryReport"]
    assert dlr["get"]["summary"] == "sms.dlr (default)"
    kinds = document["components"]["schemas"]["Accepted"]["properties"]["kind"]["enum"]
    assert sorted(kinds) == sorted(set(kinds)) == sorted(KINDS_BY_NAME)
    inbound = {p["name"]: p for p in document["paths"]["/hooks/sms/inbound"]["get"]["parameters"]}
    assert inbound["requestId"]["required"] and "msgid" not in inbound
