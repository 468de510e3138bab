"""Inbound SMS on request: ``POST /_sandbox/inbound`` and the page's form send an InboundMessage
(concatenated parts merged, missing parts marked ``<...>``) to the inbound URL on the
platform-sms schedule, recorded like every callback; the control API's lists cap the attempts of
each callback (the first and the latest, with the count of all). Time is virtual: no sleeps."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay.delivery.policies import PLATFORM_SMS, attempt_times
from relay.sandbox.inbound_sms import CONCATENATION_WAIT, DEFAULT_SENDER
from relay.sandbox.page import ATTEMPTS_SHOWN, PAGE
from relay.sandbox.settings import SandboxSettingsError, load_sandbox_settings
from relay.sandbox.state import ATTEMPTS_LISTED, Callback, CallbackAttempt
from relay.sandbox.stepped_clock import SteppedClock
from tests.sandbox_support import API_KEY, START, Api, reports, sandbox_api
from tests.support import Answer, Sink
from tests.test_sandbox_page import csrf_of, log_in

INBOUND = "/_sandbox/inbound"
PROVISIONED = "+99955500000"
HOSTILE = '<script>alert("x")</script>'
FORM = {"content-type": "application/x-www-form-urlencoded"}
GSM_200 = "".join(chr(ord("a") + n % 26) for n in range(200))


def inbound_api(sink: Sink, **settings: Any) -> Any:
    """A sandbox whose inbound URL is the sink's ``/inbound``."""
    return sandbox_api(inbound_url=sink.url("/inbound"), **settings)


async def send(api: Api, **fields: Any) -> httpx.Response:
    return await api.client.post(INBOUND, json=fields)


def problem_field(answer: httpx.Response) -> str:
    assert answer.headers["content-type"] == "application/problem+json", answer.text
    return str(answer.json()["errors"][0]["field"])


# --- the control API ---------------------------------------------------------------------------


async def test_an_inbound_sms_reaches_the_inbound_url_as_an_inbound_message(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        answer = await send(api, **{"from": "+4915112345678", "message": "Hello"})
        await api.sandbox.scheduler.idle()
    assert answer.status_code == 202
    sent = answer.json()
    [body] = reports(sink, "/inbound")
    assert body == sent["body"]
    assert (body["from"], body["to"], body["message"]) == ("+4915112345678", PROVISIONED, "Hello")
    assert (body["size"], body["missingParts"], body["requestId"]) == (
        1,
        False,
        sent["requestId"],
    )
    [part] = body["contentList"]
    assert (part["sequenceNumber"], part["sentDate"]) == (1, "2026-11-26T12:00:00.000Z")
    assert part["msgId"] and "price" in part
    assert sink.requests[0].headers["content-type"] == "application/json"


async def test_from_and_to_default_to_a_made_up_sender_and_the_provisioned_number(
    sink: Sink,
) -> None:
    async with inbound_api(sink, inbound_number="+4930111222") as api:
        await send(api, message="hi", to="")
        await api.sandbox.scheduler.idle()
    [body] = reports(sink, "/inbound")
    assert (body["from"], body["to"]) == (DEFAULT_SENDER, "+4930111222")


@pytest.mark.parametrize(
    ("text", "size"),
    [("a" * 160, 1), ("a" * 161, 2), (GSM_200, 2), ("ж" * 70, 1), ("ж" * 71, 2), ("€" * 80, 1)],
)
async def test_a_long_text_arrives_in_concatenated_parts_merged_into_one(
    sink: Sink, text: str, size: int
) -> None:
    async with inbound_api(sink) as api:
        await send(api, message=text)
        await api.sandbox.scheduler.idle()
    [body] = reports(sink, "/inbound")
    assert body["message"] == text
    assert body["size"] == size
    assert [p["sequenceNumber"] for p in body["contentList"]] == list(range(1, size + 1))
    assert len({p["msgId"] for p in body["contentList"]}) == size


async def test_parts_cuts_the_text_and_a_missing_part_is_marked_and_waited_for(
    sink: Sink,
) -> None:
    async with inbound_api(sink) as api:
        answer = await send(api, message="aaabbbccc", parts=3, missing=[2])
        await api.sandbox.scheduler.idle()
        [callback] = api.sandbox.state.callbacks.values()
    assert answer.status_code == 202
    [body] = reports(sink, "/inbound")
    assert body["message"] == "aaa<...>ccc"
    assert (body["size"], body["missingParts"]) == (3, True)
    assert [p["sequenceNumber"] for p in body["contentList"]] == [1, 3]
    assert callback.attempts[0].sent_at == START + CONCATENATION_WAIT


async def test_the_page_shows_when_an_inbound_sms_waiting_for_its_parts_is_due(
    sink: Sink,
) -> None:
    async with inbound_api(sink, clock=SteppedClock(START)) as api:
        await send(api, message="abcdef", parts=2, missing=[1])
        await api.sandbox.scheduler.idle()
        page = await api.client.get(PAGE)
    assert "Not sent yet: due at 2026-11-26T12:10:00.000Z." in page.text
    assert "Parts</dt><dd>2 (missing: 1)" in page.text
    assert sink.requests == []


async def test_without_an_inbound_url_it_is_a_409_problem_saying_how_to_set_one() -> None:
    async with sandbox_api() as api:
        answer = await send(api, message="hi")
        listed = (await api.client.get(INBOUND)).json()
    assert answer.status_code == 409
    assert answer.headers["content-type"] == "application/problem+json"
    assert "--inbound-url" in answer.json()["detail"]
    assert "inbound_url" in answer.json()["detail"]
    assert listed == {"inbound": []}


async def test_a_failing_inbound_url_is_retried_on_the_platform_sms_schedule(sink: Sink) -> None:
    sink.script["/inbound"] = [Answer(500, body=b"down"), Answer(503), Answer(502)]
    async with inbound_api(sink) as api:
        await send(api, message="retry me")
        await api.sandbox.scheduler.idle()
        [listed] = (await api.client.get(INBOUND)).json()["inbound"]
    [callback] = listed["callbacks"]
    assert (callback["policy"], callback["kind"], callback["state"]) == (
        "platform-sms",
        "sms.inbound",
        "delivered",
    )
    expected = [
        t.isoformat().replace("+00:00", ".000Z")
        for t in attempt_times(PLATFORM_SMS, START, succeed_at=4)
    ]
    assert [a["sentAt"] for a in callback["attempts"]] == expected
    assert [(a["statusCode"], a["answer"]) for a in callback["attempts"]] == [
        (500, "down"),
        (503, "thanks"),
        (502, "thanks"),
        (200, "thanks"),
    ]
    assert all(a["durationMs"] > 0 for a in callback["attempts"])


async def test_inbound_sms_are_listed_with_the_callbacks_and_forgotten_by_reset(
    sink: Sink,
) -> None:
    async with inbound_api(sink) as api:
        sent = (await send(api, message="one")).json()
        await api.sandbox.scheduler.idle()
        listed = (await api.client.get(INBOUND)).json()["inbound"]
        callbacks = (await api.client.get("/_sandbox/callbacks")).json()["callbacks"]
        await api.client.post("/_sandbox/reset")
        after = (await api.client.get(INBOUND)).json()["inbound"]
    assert [i["requestId"] for i in listed] == [sent["requestId"]]
    assert [c["subject"] for c in callbacks] == [sent["requestId"]]
    assert after == []


async def test_beyond_max_messages_the_oldest_finished_inbound_sms_is_forgotten(
    sink: Sink,
) -> None:
    async with inbound_api(sink, max_messages=2) as api:
        for text in ("one", "two", "three"):
            await send(api, message=text)
            await api.sandbox.scheduler.idle()
        listed = (await api.client.get(INBOUND)).json()["inbound"]
    assert [i["message"] for i in listed] == ["two", "three"]


async def test_a_line_break_and_a_tab_are_text(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        answer = await send(api, message="line one\r\nline\ttwo")
        await api.sandbox.scheduler.idle()
    assert answer.status_code == 202
    assert reports(sink, "/inbound")[0]["message"] == "line one\r\nline\ttwo"


DROP = object()
"""A change that removes the field."""
BAD_FIELDS = [
    ({"message": DROP}, "message"),
    ({"message": ""}, "message"),
    ({"message": None}, "message"),
    ({"message": 5}, "message"),
    ({"message": ["hi"]}, "message"),
    ({"message": "x" * 10_001}, "message"),
    ({"message": "nul\x00"}, "message"),
    ({"message": "\x1b[31mred"}, "message"),
    ({"message": "del\x7f"}, "message"),
    ({"message": "c1\x85"}, "message"),
    ({"from": 4915112345678}, "from"),
    ({"from": "ACME"}, "from"),
    ({"from": "+0123456789"}, "from"),
    ({"from": "+49 151 1234"}, "from"),
    ({"from": "+4915112345678\n"}, "from"),
    ({"from": "+" + "1" * 5000}, "from"),
    ({"from": ["+4915112345678"]}, "from"),
    ({"to": True}, "to"),
    ({"to": "+١٢٣٤٥٦٧٨"}, "to"),
    ({"to": "+491511\x00"}, "to"),
    ({"parts": "2"}, "parts"),
    ({"parts": True}, "parts"),
    ({"parts": 1.5}, "parts"),
    ({"parts": 0}, "parts"),
    ({"parts": -1}, "parts"),
    ({"parts": 256, "message": "x" * 300}, "parts"),
    ({"parts": 10**30}, "parts"),
    ({"parts": 6, "message": "short"}, "parts"),
    ({"parts": 1, "message": GSM_200}, "parts"),
    ({"missing": 1}, "missing"),
    ({"missing": "1"}, "missing"),
    ({"missing": {"1": 1}}, "missing"),
    ({"missing": [0], "parts": 2}, "missing"),
    ({"missing": [3], "parts": 2}, "missing"),
    ({"missing": [1, 1], "parts": 3}, "missing"),
    ({"missing": [1, 2], "parts": 2}, "missing"),
    ({"missing": [True], "parts": 2}, "missing"),
    ({"missing": [1.0], "parts": 2}, "missing"),
    ({"missing": [None], "parts": 2}, "missing"),
    ({"missing": list(range(1, 300)), "parts": 2}, "missing"),
    ({"mising": [1]}, "mising"),
    ({"x" * 5000: 1}, "x" * 40),
]


@pytest.mark.parametrize(("changes", "field"), BAD_FIELDS)
async def test_a_bad_field_is_a_400_problem_naming_it(
    sink: Sink, changes: dict[str, Any], field: str
) -> None:
    fields = {"message": "abcdefghij", **changes}
    fields = {k: v for k, v in fields.items() if v is not DROP}
    async with inbound_api(sink) as api:
        answer = await send(api, **fields)
        await api.sandbox.scheduler.idle()
        recorded = dict(api.sandbox.state.inbound)
    assert answer.status_code == 400, answer.text
    assert problem_field(answer) == field
    assert recorded == {}
    assert sink.requests == []


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"", {}, 400),
        (b"not json", {}, 400),
        (b'["message"]', {}, 400),
        (b'{"message": "\xff"}', {}, 400),
        (b'{"message": "\\ud800"}', {}, 400),
        (b"[" * 100_000, {}, 413),
        (json.dumps({"message": "x" * 70_000}).encode(), {}, 413),
    ],
)
async def test_a_body_that_is_no_json_object_is_refused(
    sink: Sink, body: bytes, headers: dict[str, str], status: int
) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.post(
            INBOUND, content=body, headers={"content-type": "application/json", **headers}
        )
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/problem+json"


async def test_a_repeated_json_key_counts_once_the_last(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.post(
            INBOUND,
            content=b'{"message": "first", "message": "second"}',
            headers={"content-type": "application/json"},
        )
        await api.sandbox.scheduler.idle()
    assert answer.status_code == 202
    assert reports(sink, "/inbound")[0]["message"] == "second"


async def test_a_query_parameter_given_twice_is_refused(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.post(f"{INBOUND}?a=1&a=2", json={"message": "hi"})
    assert answer.status_code == 400
    assert problem_field(answer) == "a"


@pytest.mark.parametrize("key", [None, "", "wrong", API_KEY + " "])
async def test_without_the_key_nothing_is_sent(sink: Sink, key: str | None) -> None:
    async with inbound_api(sink) as api:
        api.client.headers.pop("apikey")
        headers = {} if key is None else {"apikey": key}
        answer = await api.client.post(INBOUND, json={"message": "hi"}, headers=headers)
        listed = await api.client.get(INBOUND, headers=headers)
        await api.sandbox.scheduler.idle()
    assert (answer.status_code, listed.status_code) == (401, 401)
    assert sink.requests == []


async def test_the_key_given_twice_is_refused(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        api.client.headers.pop("apikey")
        answer = await api.client.post(
            INBOUND, json={"message": "hi"}, headers=[("apikey", API_KEY), ("apikey", API_KEY)]
        )
    assert answer.status_code == 401


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
async def test_a_wrong_method_is_405(sink: Sink, method: str) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.request(method, INBOUND)
    assert answer.status_code == 405
    assert answer.headers["content-type"] == "application/problem+json"


# --- the provisioned number (config) --------------------------------------------------------


@pytest.mark.parametrize(
    "value", ['""', '"ACME"', '"+0123456"', "4915112345678", '"+49151\\u0000"', '["+4930111222"]']
)
def test_a_provisioned_number_not_in_international_format_is_refused(
    tmp_path: Path, value: str
) -> None:
    config = tmp_path / "sandbox.toml"
    config.write_text(f"inbound_number = {value}\n", encoding="utf-8")
    with pytest.raises(SandboxSettingsError, match="inbound_number"):
        load_sandbox_settings(config, {})


def test_the_provisioned_number_defaults_to_a_made_up_one(tmp_path: Path) -> None:
    config = tmp_path / "sandbox.toml"
    config.write_text('inbound_number = "+4930111222"\n', encoding="utf-8")
    assert load_sandbox_settings(None, {}).inbound_number == PROVISIONED
    assert load_sandbox_settings(config, {}).inbound_number == "+4930111222"


# --- the page's form ----------------------------------------------------------------------------


async def test_the_pages_form_sends_an_inbound_sms_and_shows_a_notice(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        browser = await log_in(api)
        page = await browser.get(PAGE)
        answer = await browser.post(
            f"{PAGE}/inbound",
            data={
                "csrf": csrf_of(page.text),
                "from": "+4915112345678",
                "to": "+4930111222",
                "message": HOSTILE,
            },
        )
        await api.sandbox.scheduler.idle()
        after = await browser.get(answer.headers["location"])
        await browser.aclose()
    assert answer.status_code == 303
    assert answer.headers["location"] == f"{PAGE}?inbound=1"
    [body] = reports(sink, "/inbound")
    assert (body["from"], body["to"], body["message"]) == ("+4915112345678", "+4930111222", HOSTILE)
    assert "Inbound SMS sent" in after.text
    assert "Inbound SMS to +4930111222 from +4915112345678" in after.text
    assert "<script>" not in after.text
    assert "&lt;script&gt;" in after.text


async def test_the_form_with_empty_numbers_uses_the_defaults(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.post(
            f"{PAGE}/inbound", data={"from": "", "to": "", "message": "hi"}
        )
        await api.sandbox.scheduler.idle()
    assert answer.status_code == 303
    [body] = reports(sink, "/inbound")
    assert (body["from"], body["to"]) == (DEFAULT_SENDER, PROVISIONED)


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        ({"message": ""}, "message: is required"),
        ({"from": "ACME", "message": "hi"}, "from: must be a number"),
        ({"to": HOSTILE, "message": "hi"}, "to: must be a number"),
        ({"message": "bell\x07"}, "message: holds a control character"),
        ({"message": "hi", "parts": "2"}, "parts: is not a field"),
        ({"message": "hi", HOSTILE: "1"}, "is not a field"),
    ],
)
async def test_bad_form_values_show_the_page_with_the_reason(
    sink: Sink, data: dict[str, str], shown: str
) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.post(f"{PAGE}/inbound", data=data)
        await api.sandbox.scheduler.idle()
    assert answer.status_code == 400
    assert answer.headers["content-type"].startswith("text/html")
    assert shown in answer.text
    assert "<script>" not in answer.text
    assert sink.requests == []


async def test_the_form_without_an_inbound_url_is_a_409_page_saying_how_to_set_one() -> None:
    async with sandbox_api() as api:
        page = await api.client.get(PAGE)
        answer = await api.client.post(f"{PAGE}/inbound", data={"message": "hi"})
    assert f'action="{PAGE}/inbound"' not in page.text
    assert "--inbound-url" in page.text
    assert answer.status_code == 409
    assert "--inbound-url" in answer.text


@pytest.mark.parametrize("csrf", [None, "", "0" * 64, "é", "x" * 3000])
async def test_the_form_without_the_right_csrf_token_is_refused(
    sink: Sink, csrf: str | None
) -> None:
    async with inbound_api(sink) as api:
        browser = await log_in(api)
        data = {"message": "hi"} | ({} if csrf is None else {"csrf": csrf})
        answer = await browser.post(f"{PAGE}/inbound", data=data)
        await api.sandbox.scheduler.idle()
        await browser.aclose()
    assert answer.status_code == 403
    assert sink.requests == []


async def test_the_form_without_a_session_or_key_is_401(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        api.client.headers.pop("apikey")
        answer = await api.client.post(f"{PAGE}/inbound", data={"csrf": "x", "message": "hi"})
    assert answer.status_code == 401
    assert sink.requests == []


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"message=hi&message=again", FORM, 400),
        (b"message=%FF", FORM, 400),
        (b"message=" + b"x" * 5000, FORM, 413),
        (b'{"message": "hi"}', {"content-type": "application/json"}, 400),
        (b"a=1&" * 20, FORM, 400),
    ],
)
async def test_a_malformed_form_is_refused(
    sink: Sink, body: bytes, headers: dict[str, str], status: int
) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.post(f"{PAGE}/inbound", content=body, headers=headers)
        await api.sandbox.scheduler.idle()
    assert answer.status_code == status
    assert sink.requests == []


async def test_the_form_answers_get_with_405(sink: Sink) -> None:
    async with inbound_api(sink) as api:
        answer = await api.client.get(f"{PAGE}/inbound")
    assert answer.status_code == 405


# --- the cap on attempts ------------------------------------------------------------------------


def failing(count: int) -> Callback:
    callback = Callback(
        "cb", "s", "sms.inbound", "x", "http://x", "POST", {}, "platform-sms", START
    )
    callback.attempts = [
        CallbackAttempt(n, START, START + timedelta(seconds=10 * n), 500, None, 1.0)
        for n in range(1, count + 1)
    ]
    return callback


@pytest.mark.parametrize("count", [0, 1, ATTEMPTS_LISTED])
def test_up_to_the_cap_every_attempt_is_listed(count: int) -> None:
    listed = failing(count).as_json()
    assert [a["number"] for a in listed["attempts"]] == list(range(1, count + 1))
    assert (listed["attemptCount"], listed["attemptsOmitted"]) == (count, 0)


def test_beyond_the_cap_the_first_and_the_latest_attempts_are_listed() -> None:
    listed = failing(17_280).as_json()
    numbers = [a["number"] for a in listed["attempts"]]
    assert len(numbers) == ATTEMPTS_LISTED
    assert numbers == [1, *range(17_280 - ATTEMPTS_LISTED + 2, 17_281)]
    assert (listed["attemptCount"], listed["attemptsOmitted"]) == (
        17_280,
        17_280 - ATTEMPTS_LISTED,
    )


async def test_the_control_apis_lists_cap_the_attempts_of_a_failing_callback(sink: Sink) -> None:
    failures = ATTEMPTS_LISTED + 20
    sink.script["/inbound"] = [Answer(500)] * failures
    async with inbound_api(sink) as api:
        await send(api, message="flaky")
        await api.sandbox.scheduler.idle()
        inbound = (await api.client.get(INBOUND)).json()["inbound"][0]["callbacks"][0]
        [callback] = (await api.client.get("/_sandbox/callbacks")).json()["callbacks"]
        page = await api.client.get(PAGE)
    for listed in (inbound, callback):
        assert listed["attemptCount"] == failures + 1
        assert listed["attemptsOmitted"] == failures + 1 - ATTEMPTS_LISTED
        numbers = [a["number"] for a in listed["attempts"]]
        assert numbers[0] == 1 and numbers[-1] == failures + 1
        assert listed["attempts"][-1]["statusCode"] == 200
    assert f"{failures + 1 - ATTEMPTS_SHOWN} earlier attempts not shown" in page.text
