"""The sandbox's number information: GET /nis/v1/gnp and /nis/v1/gnv answer at once without a
callbackUrl; with one, the answer carries the requestId and the result is POSTed there on the
platform's numinfo schedule (200 within 2 s; 1, 5, 10, 20, 30, 60 min, then hourly; 48 h)."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest

from receivers.payloads.numinfo import GnpResult, GnvResult
from relay.sandbox.stepped_clock import SteppedClock
from tests.sandbox_support import API_KEY, START, sandbox_api
from tests.support import Answer, Sink

MINUTE = timedelta(minutes=1)


@pytest.mark.parametrize(
    ("product", "msisdn", "ported"),
    [
        ("gnp", "+99900000010", "true"),
        ("gnp", "+99900000011", "false"),
        ("gnp", "+4915112345678", "false"),
    ],
)
async def test_a_portability_check_without_callback_url_answers_the_result(
    product: str, msisdn: str, ported: str
) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(f"/nis/v1/{product}", params={"msisdn": msisdn})
    assert answer.status_code == 200
    body = answer.json()
    assert (body["msisdn"], body["ported"], body["synchronous"]) == (msisdn, ported, True)
    assert body["requestId"] and body["operator"] and body["mcc"]
    GnpResult.model_validate(body)


async def test_an_hlr_lookup_of_the_absent_subscriber_says_so() -> None:
    async with sandbox_api() as api:
        absent = (await api.client.get("/nis/v1/gnv", params={"msisdn": "+99900000012"})).json()
        other = (await api.client.get("/nis/v1/gnv", params={"msisdn": "+4915112345678"})).json()
    assert (absent["presence"], absent["errorCode"]) == ("false", "027")
    assert other["presence"] == "true" and "errorCode" not in other
    GnvResult.model_validate(absent)
    assert {"nrhMCC", "imsi", "hlrOperator", "mscCountry"} <= set(absent)


async def test_the_same_number_gets_the_same_operator() -> None:
    async with sandbox_api() as api:
        first, second = [
            (await api.client.get("/nis/v1/gnp", params={"msisdn": "+4917612345678"})).json()
            for _ in range(2)
        ]
    assert first["operator"] == second["operator"]
    assert first["requestId"] != second["requestId"]


async def test_with_callback_url_the_result_is_posted_once_accepted(sink: Sink) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(
            "/nis/v1/gnp", params={"msisdn": "+99900000010", "callbackUrl": sink.url()}
        )
        await api.sandbox.scheduler.idle()
    assert answer.json() == {
        "requestId": answer.json()["requestId"],
        "msisdn": "+99900000010",
        "synchronous": False,
    }
    [posted] = sink.requests
    body = json.loads(posted.body)
    assert posted.method == "POST"
    assert (body["requestId"], body["ported"], body["synchronous"]) == (
        answer.json()["requestId"],
        "true",
        False,
    )


async def test_a_failing_receiver_gets_the_numinfo_schedule(sink: Sink) -> None:
    sink.answers["/hook"] = Answer(status=503)
    async with sandbox_api() as api:
        await api.client.get(
            "/nis/v1/gnv", params={"msisdn": "+4915112345678", "callbackUrl": sink.url()}
        )
        await api.sandbox.scheduler.idle()
        [callback] = api.sandbox.state.callbacks.values()
    sent = [a.sent_at - START for a in callback.attempts]
    first = sent[0]
    assert first == timedelta(seconds=1)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert gaps[:7] == [MINUTE * n for n in (1, 5, 10, 20, 30, 60, 60)]
    assert callback.state == "given-up"
    assert sent[-1] - first <= timedelta(hours=48)
    assert sent[-1] - first > timedelta(hours=46)


async def test_a_200_later_than_two_seconds_is_a_failure(sink: Sink) -> None:
    """Answer budget: a receiver answering 200 after 2 s is retried (measured, real time)."""
    sink.script["/hook"] = [Answer(delay=2.3)]
    async with sandbox_api() as api:
        await api.client.get(
            "/nis/v1/gnp", params={"msisdn": "+4915112345678", "callbackUrl": sink.url()}
        )
        await api.sandbox.scheduler.idle()
        [callback] = api.sandbox.state.callbacks.values()
    assert [a.error is not None or a.status_code for a in callback.attempts] == [True, 200]
    assert callback.state == "delivered"


@pytest.mark.parametrize("product", ["gnp", "gnv"])
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "msisdn"),
        ({"msisdn": ""}, "msisdn"),
        ({"msisdn": "4915112345678"}, "msisdn"),
        ({"msisdn": "+49 151 1234"}, "msisdn"),
        ({"msisdn": "+" + "1" * 5000}, "msisdn"),
        ({"msisdn": "+4915112345678\x00"}, "msisdn"),
        ({"msisdn": "+" + "".join(chr(0xFF10 + int(d)) for d in "4915112345678")}, "msisdn"),
        ({"msisdn": "+4915112345678", "callbackUrl": "ftp://example.com/x"}, "callbackUrl"),
        ({"msisdn": "+4915112345678", "callbackUrl": "javascript:alert(1)"}, "callbackUrl"),
        ({"msisdn": "+4915112345678", "callbackUrl": "http://"}, "callbackUrl"),
        ({"msisdn": "+4915112345678", "callbackUrl": "http://a:99999/"}, "callbackUrl"),
        ({"msisdn": "+4915112345678", "callbackUrl": "http://x/" + "a" * 3000}, "callbackUrl"),
        ({"msisdn": "+4915112345678", "callbackUrl": "http://x/\n"}, "callbackUrl"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(
    product: str, params: dict[str, str], field: str
) -> None:
    async with sandbox_api() as api:
        answer = await api.client.get(f"/nis/v1/{product}", params=params)
        assert api.sandbox.state.lookups == {}
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["errors"][0]["field"] == field


async def test_a_repeated_msisdn_is_refused() -> None:
    async with sandbox_api() as api:
        answer = await api.client.get("/nis/v1/gnp?msisdn=%2B4915112345678&msisdn=%2B4915112345679")
    assert answer.status_code == 400
    assert answer.json()["errors"][0]["field"] == "msisdn"


async def test_bad_percent_encoding_is_not_a_500() -> None:
    async with sandbox_api() as api:
        answer = await api.client.get("/nis/v1/gnp?msisdn=%FF%FE")
    assert answer.status_code == 400


@pytest.mark.parametrize("headers", [{}, {"apikey": "wrong"}, {"apikey": ""}])
async def test_without_the_key_it_is_401(headers: dict[str, str]) -> None:
    async with sandbox_api() as api:
        api.client.headers.pop("apikey")
        answer = await api.client.get(
            "/nis/v1/gnv", params={"msisdn": "+4915112345678"}, headers=headers
        )
    assert answer.status_code == 401
    assert answer.headers["content-type"] == "application/problem+json"


async def test_the_key_twice_is_401() -> None:
    async with sandbox_api() as api:
        api.client.headers.pop("apikey")
        answer = await api.client.get(
            "/nis/v1/gnp",
            params={"msisdn": "+4915112345678"},
            headers=[("apikey", API_KEY), ("apikey", API_KEY)],
        )
    assert answer.status_code == 401


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_other_methods_are_405(method: str) -> None:
    async with sandbox_api() as api:
        answer = await api.client.request(method, "/nis/v1/gnp?msisdn=%2B4915112345678")
    assert answer.status_code == 405
    assert answer.headers["content-type"] == "application/problem+json"


async def test_chaos_duplicate_sends_the_result_twice(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.client.get(
            "/nis/v1/gnp",
            params={"msisdn": "+4915112345678", "callbackUrl": sink.url()},
            headers={"x-sandbox-chaos": "duplicate"},
        )
        await api.sandbox.scheduler.idle()
    first, second = sink.bodies()
    assert first == second


async def test_the_control_api_lists_lookups_with_their_callbacks(sink: Sink) -> None:
    async with sandbox_api() as api:
        await api.client.get(
            "/nis/v1/gnv", params={"msisdn": "+99900000012", "callbackUrl": sink.url()}
        )
        await api.sandbox.scheduler.idle()
        listed = (await api.client.get("/_sandbox/lookups")).json()["lookups"]
    [lookup] = listed
    assert (lookup["product"], lookup["outcome"]) == ("gnv", "absent-subscriber")
    assert [a["statusCode"] for a in lookup["callbacks"][0]["attempts"]] == [200]


async def test_beyond_max_messages_the_oldest_finished_lookups_are_forgotten() -> None:
    async with sandbox_api(max_messages=2) as api:
        ids = [
            (await api.client.get("/nis/v1/gnp", params={"msisdn": f"+491511234567{n}"})).json()[
                "requestId"
            ]
            for n in range(3)
        ]
        assert list(api.sandbox.state.lookups) == ids[1:]


async def test_when_every_kept_lookup_is_under_way_a_new_one_is_a_503() -> None:
    params = {"msisdn": "+4915112345678", "callbackUrl": "http://127.0.0.1:9/x"}
    async with sandbox_api(SteppedClock(START), max_messages=1) as api:
        first = await api.client.get("/nis/v1/gnp", params=params)
        second = await api.client.get("/nis/v1/gnp", params=params)
        assert list(api.sandbox.state.lookups) == [first.json()["requestId"]]
    assert second.status_code == 503
    assert second.headers["retry-after"] == "1"


async def test_the_price_applies_from_the_month_of_the_sandbox_clock() -> None:
    async with sandbox_api(SteppedClock(datetime(2025, 3, 15, 9, 30, tzinfo=UTC))) as api:
        body = (await api.client.get("/nis/v1/gnv", params={"msisdn": "+4915112345678"})).json()
    assert body["priceEffective"] == "2025-03-01T00:00:00.000Z"
