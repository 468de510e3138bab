"""The console in-process: access, CSRF, escaping, lists and their filters, actions."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store import RejectedBody
from relay import outbox
from relay.console.script import LIVE_SCRIPT, script_hash
from relay.console.sessions import SESSION_COOKIE
from relay.outbox.tables import DEAD, HELD, PENDING
from relay.simulator import factories
from tests.conftest import TOKEN, running_client
from tests.console_support import PASSWORD, USER, ConsoleClient, console_client
from tests.relay_support import START, Clock, Relay, store_events
from tests.support import Answer, Sink

NEXT = re.compile(r'<a href="(/console/events\?[^"]*)" rel="next">')
HOSTILE_TEXTS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>')


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def console(engine: AsyncEngine, clock: Clock) -> AsyncIterator[ConsoleClient]:
    async with console_client(engine, clock, ["sink", "other"]) as client:
        yield client


@pytest.fixture
async def operator(console: ConsoleClient) -> ConsoleClient:
    answer = await console.login()
    assert answer.status_code == 303, answer.text
    return console


async def sms(engine: AsyncEngine, clock: Clock, count: int, **overrides: str) -> list[str]:
    bodies = [
        factories.sms_inbound({"requestId": f"req-{i:04d}", **overrides}) for i in range(count)
    ]
    return await store_events(engine, [("/hooks/sms/inbound", body) for body in bodies], clock)


# --- access -----------------------------------------------------------------------------


async def test_every_page_wants_a_login(console: ConsoleClient) -> None:
    for path in (
        "/console/events",
        "/console/deliveries",
        "/console/destinations",
        "/console/quarantine",
        "/console/events/x?q=1",
    ):
        answer = await console.http.get(path)
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/console/login?next=%2Fconsole%2F")


async def test_an_action_without_a_session_is_forbidden(console: ConsoleClient) -> None:
    answer = await console.http.post("/console/deliveries/replay", data={"confirm": "yes"})
    assert answer.status_code == 403
    assert answer.headers["content-type"] == "application/problem+json"


async def test_login_goes_where_it_was_asked_and_only_inside_the_console(
    console: ConsoleClient,
) -> None:
    form = await console.http.get("/console/login?next=/console/deliveries%3Fstatus%3Ddead")
    assert 'value="/console/deliveries?status=dead"' in form.text
    for hostile in ("https://evil.test/", "//evil.test/console/", "/console/..\\evil", "/other"):
        form = await console.http.get("/console/login", params={"next": hostile})
        assert 'name="next" value="/console/events"' in form.text


async def test_wrong_password_unknown_user_and_empty_fields_are_refused(
    console: ConsoleClient,
) -> None:
    for user, password in ((USER, "wrong"), ("mallory", PASSWORD), ("", ""), (USER, "")):
        answer = await console.login(user, password)
        assert answer.status_code == 401
        assert SESSION_COOKIE not in answer.cookies
    assert (await console.http.get("/console/events")).status_code == 303


async def test_a_login_without_its_form_token_is_refused(console: ConsoleClient) -> None:
    await console.http.get("/console/login")
    for token in ("", "forged"):
        answer = await console.http.post(
            "/console/login", data={"token": token, "user": USER, "password": PASSWORD}
        )
        assert answer.status_code == 403
    console.http.cookies.clear()
    answer = await console.http.post(
        "/console/login", data={"token": "x", "user": USER, "password": PASSWORD}
    )
    assert answer.status_code == 403


async def test_a_tampered_session_cookie_is_no_session(console: ConsoleClient) -> None:
    await console.login()
    cookie = console.http.cookies[SESSION_COOKIE]
    console.http.cookies.clear()
    flipped = cookie[:-1] + ("B" if cookie.endswith("A") else "A")
    for tampered in (flipped, cookie + "x", cookie[1:]):
        console.http.cookies.set(SESSION_COOKIE, tampered)
        assert (await console.http.get("/console/events")).status_code == 303
    console.http.cookies.set(SESSION_COOKIE, cookie)
    assert (await console.http.get("/console/events")).status_code == 200


async def test_actions_need_the_sessions_csrf_token(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    for token in (None, "", "0" * 64):
        data = {"other": "1"} if token is None else {"csrf": token}
        answer = await operator.http.post("/console/destinations/sink/disable", data=data)
        assert answer.status_code == 403
    states = await outbox_states(engine)
    assert not states.get("sink", {}).get("disabled")


async def test_logout_ends_the_session(operator: ConsoleClient) -> None:
    answer = await operator.act("/console/logout")
    assert answer.status_code == 303
    assert (await operator.http.get("/console/events")).status_code == 303


async def test_every_answer_carries_the_security_headers(operator: ConsoleClient) -> None:
    for path in (
        "/console/events",
        "/console/login",
        "/console/nowhere",
        "/console/static/console.css",
    ):
        answer = await operator.http.get(path)
        policy = answer.headers["content-security-policy"]
        assert "default-src 'none'" in policy
        # one script may run: the console's own, by its hash (tests/test_console_live.py)
        assert f"script-src {script_hash(LIVE_SCRIPT)};" in policy
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["cache-control"] == "no-store"


# --- lists ------------------------------------------------------------------------------


async def test_hostile_payloads_render_as_text(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = []
    for index, text in enumerate(HOSTILE_TEXTS):
        body = factories.sms_inbound({"requestId": f"evil-{index}", "message": text})
        ids += await store_events(engine, [("/hooks/sms/inbound", body)], clock)
    for event_id in ids:
        page = (await operator.http.get(f"/console/events/{event_id}")).text
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page or "&lt;img src=x" in page
    page = (await operator.http.get("/console/events", params={"q": '"><img src=x>'})).text
    assert "<img src=x>" not in page


async def test_a_payload_with_a_lone_surrogate_renders_as_its_escape(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    """Valid JSON, not UTF-8: accepted and relayed, so the console shows it too."""
    body = json.dumps(factories.sms_inbound({"requestId": "lone", "message": "a\ud800b"}))
    async with running_client(engine, clock=clock) as client:
        answer = await client.post(
            f"/hooks/sms/inbound?token={TOKEN}",
            content=body,
            headers={"content-type": "application/json"},
        )
    assert answer.status_code == 200, answer.text
    page = await operator.http.get(f"/console/events/{answer.json()['id']}")
    assert page.status_code == 200
    assert "a\\ud800b" in page.text
    listed = await operator.http.get("/console/events", params={"q": "lone"})
    assert listed.status_code == 200 and answer.json()["id"] in listed.text


async def test_the_events_page_finds_an_event_by_its_platform_id(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = await sms(engine, clock, 5)
    page = await operator.http.get("/console/events", params={"q": "req-0003"})
    assert page.status_code == 200
    assert f"/console/events/{ids[3]}" in page.text
    assert sum(f"/console/events/{i}" in page.text for i in ids) == 1


async def test_the_events_page_filters_by_kind_event_and_time(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    inbound = await sms(engine, clock, 2)
    clock.advance(timedelta(minutes=10))
    reports = await store_events(
        engine,
        [
            ("/hooks/sms/dlr", factories.sms_dlr({"requestId": "r-1"}, status="DELIVERED")),
            ("/hooks/sms/dlr", factories.sms_dlr({"requestId": "r-2"}, status="NOT_DELIVERED")),
        ],
        clock,
    )

    async def listed(**params: str) -> set[str]:
        page = await operator.http.get("/console/events", params=params)
        assert page.status_code == 200, page.text
        return {i for i in inbound + reports if f"/console/events/{i}" in page.text}

    assert await listed() == set(inbound + reports)
    assert await listed(kind="sms.dlr") == set(reports)
    assert await listed(kind="sms.dlr", event="Delivered") == {reports[0]}
    since = (START + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M")
    assert await listed(since=since) == set(reports)
    assert await listed(until=since) == set(inbound)
    assert await listed(source="default") == set(inbound + reports)


@pytest.mark.slow
async def test_pages_follow_each_other_without_gaps_or_repeats(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    ids = set(await sms(engine, clock, 120))
    seen: list[str] = []
    url = "/console/events"
    while url:
        page = (await operator.http.get(url)).text
        seen += [i for i in ids if f"/console/events/{i}" in page]
        found = NEXT.search(page)
        url = found[1].replace("&amp;", "&") if found else ""
    assert len(seen) == len(ids) and set(seen) == ids


@pytest.mark.parametrize(
    "params",
    [
        {"kind": "sms.nope"},
        {"source": "nobody"},
        {"since": "yesterday"},
        {"before": "not-a-cursor"},
        {"before": "99999999999999999999~00000000-0000-7000-8000-000000000000"},
        {"q": "x" * 201},
        {"q": "a\x00b"},
        {"before": "\uff11\uff17\uff19~00000000-0000-7000-8000-000000000000"},  # wide digits
        {"before": " 1795~00000000-0000-7000-8000-000000000000"},
    ],
)
async def test_bad_filters_are_a_400_problem(
    operator: ConsoleClient, params: dict[str, str]
) -> None:
    answer = await operator.http.get("/console/events", params=params)
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"
    name = next(iter(params))
    assert answer.json()["detail"].startswith("q:" if name == "q" else f"{name}:")


async def test_a_browser_gets_errors_as_a_page(operator: ConsoleClient) -> None:
    answer = await operator.http.get(
        "/console/events", params={"kind": "<b>x</b>"}, headers={"accept": "text/html"}
    )
    assert answer.status_code == 400
    assert answer.headers["content-type"].startswith("text/html")
    assert "<b>x</b>" not in answer.text


@pytest.mark.parametrize("query", ["q=%ff", "q=a%c3", "kind=%ed%a0%80"])
async def test_a_query_that_is_not_utf8_is_a_400_problem(
    operator: ConsoleClient, query: str
) -> None:
    """Percent-escapes decode as UTF-8 or the query is refused (never replaced by U+FFFD)."""
    raw = query.encode("latin-1")
    answer = await operator.http.get(httpx.URL("/console/events", query=raw))
    assert answer.status_code == 400
    assert "not UTF-8" in answer.json()["detail"]


async def test_a_repeated_parameter_is_refused(operator: ConsoleClient) -> None:
    answer = await operator.http.get("/console/events?kind=sms.dlr&kind=sms.inbound")
    assert answer.status_code == 400
    assert "more than once" in answer.json()["detail"]


async def test_unknown_ids_and_wrong_methods(operator: ConsoleClient) -> None:
    for path in (
        "/console/events/nope",
        "/console/events/00000000-0000-7000-8000-000000000000",
        "/console/quarantine/%00",
        "/console/nowhere",
    ):
        assert (await operator.http.get(path)).status_code == 404
    assert (await operator.http.get("/console/deliveries/replay")).status_code == 405
    assert (await operator.http.delete("/console/events")).status_code == 405


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"csrf=" + b"x" * 20_000, "application/x-www-form-urlencoded"),
        (b'{"csrf": "x"}', "application/json"),
        (b"csrf=\xff\xfe", "application/x-www-form-urlencoded"),
        (b"csrf=x&reason=%ff%fe", "application/x-www-form-urlencoded"),
        (b"csrf=a&csrf=b", "application/x-www-form-urlencoded"),
        (b"&".join(b"f%d=1" % i for i in range(100)), "application/x-www-form-urlencoded"),
    ],
)
async def test_bad_forms_are_refused(
    operator: ConsoleClient, content: bytes, content_type: str
) -> None:
    answer = await operator.http.post(
        "/console/destinations/sink/disable",
        content=content,
        headers={"content-type": content_type},
    )
    assert answer.status_code == 400


# --- actions ----------------------------------------------------------------------------


async def test_an_event_shows_its_timeline_and_a_replay_makes_it_due_at_once(
    engine: AsyncEngine, clock: Clock, sink: Sink, operator: ConsoleClient
) -> None:
    sink.answers["/hook"] = Answer(status=503)
    relay = Relay(engine, {"sink": {"type": "http", "url": sink.url()}}, clock)
    try:
        (event_id,) = await sms(engine, clock, 1)
        (due,) = await relay.route_all()
        retry = await relay.deliverer.attempt(due.id)
    finally:
        await relay.aclose()
    assert retry is not None
    page = (await operator.http.get(f"/console/events/{event_id}")).text
    assert "503" in page and "next attempt" in page
    assert retry.at.strftime("%Y-%m-%d %H:%M:%S") in page

    clock.advance(timedelta(seconds=3))
    answer = await operator.act(
        f"/console/deliveries/{due.id}/replay", back=f"/console/events/{event_id}"
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/console/events/{event_id}?notice=replayed&count=1"
    shown = (await operator.http.get(answer.headers["location"])).text
    assert "Replayed 1 delivery: it is due now." in shown
    assert [(d.id, d.at) for d in operator.enqueued] == [(due.id, clock())]


async def test_bulk_replay_counts_first_and_replays_only_what_it_counted(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient, caplog: pytest.LogCaptureFixture
) -> None:
    relay = Relay(
        engine,
        {
            "sink": {"type": "http", "url": "http://127.0.0.1:9/"},
            "other": {"type": "http", "url": "http://127.0.0.1:9/"},
        },
        clock,
    )
    try:
        await sms(engine, clock, 6)
        due = await relay.route_all()
    finally:
        await relay.aclose()
    async with engine.begin() as conn:
        await conn.execute(update(outbox.DELIVERIES).values(status=DEAD, next_attempt_at=None))
    confirm = await operator.act("/console/deliveries/replay", destination="sink")
    assert confirm.status_code == 200
    assert '<strong class="count">6</strong>' in confirm.text
    assert set((await statuses(engine)).values()) == {DEAD}  # counting replays nothing

    with caplog.at_level(logging.INFO, logger="relay.console"):
        done = await operator.act(
            "/console/deliveries/replay", destination="sink", confirm="yes", count="6"
        )
    assert done.status_code == 303
    after = await statuses(engine)
    sink_ids = {d.id for d in due} & {i for i, s in after.items() if s == PENDING}
    assert len(sink_ids) == 6 and len(operator.enqueued) == 6
    assert sum(status == DEAD for status in after.values()) == 6  # the other destination's
    assert any(
        r.getMessage()
        == f"console: {USER} replayed 6 dead deliveries (status=dead&destination=sink)"
        and r.user == USER  # type: ignore[attr-defined]
        for r in caplog.records
    )


async def test_disable_holds_a_destination_and_enable_releases_it(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    answer = await operator.act("/console/destinations/sink/disable")
    assert answer.status_code == 303
    states = await outbox_states(engine)
    assert states["sink"]["disabled"] and states["sink"]["disabled_reason"] == f"disabled by {USER}"
    page = (await operator.http.get("/console/destinations")).text
    assert "held" in page and f"disabled by {USER}" in page

    relay = Relay(engine, {"sink": {"type": "http", "url": "http://127.0.0.1:9/"}}, clock)
    try:
        await sms(engine, clock, 2)
        for due in await relay.route_all():
            assert await relay.deliverer.attempt(due.id) is None  # held, not attempted
    finally:
        await relay.aclose()
    assert set((await statuses(engine)).values()) == {HELD}
    assert (await operator.act("/console/destinations/sink/enable")).status_code == 303
    assert set((await statuses(engine)).values()) == {PENDING}
    assert len(operator.enqueued) == 2
    assert (await operator.act("/console/destinations/nobody/enable")).status_code == 404


async def test_the_destinations_page_charts_the_last_hour(
    engine: AsyncEngine, clock: Clock, sink: Sink, operator: ConsoleClient
) -> None:
    sink.script["/hook"] = [Answer(status=500)]
    relay = Relay(engine, {"sink": {"type": "http", "url": sink.url()}}, clock)
    try:
        await sms(engine, clock, 3)
        for due in await relay.route_all():
            await relay.deliverer.attempt(due.id)
    finally:
        await relay.aclose()
    page = (await operator.http.get("/console/destinations")).text
    assert "3 attempts, 66.7 % succeeded" in page
    assert page.count('<rect class="ok"') == 12


async def test_quarantined_bodies_are_shown_as_text(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            RejectedBody.__table__.insert().values(
                id="0190a0b0-0000-7000-8000-000000000001",
                source="default",
                path="/hooks/sms/inbound",
                kind="sms.inbound",
                status=400,
                reason="not JSON",
                errors=[],
                body_hash="sha256:x",
                raw_body=b"<script>alert(1)</script>\xff",
                content_type="text/html",
                remote_addr="127.0.0.1",
                received_at=clock(),
                last_seen_at=clock(),
                count=2,
            )
        )
    listing = (await operator.http.get("/console/quarantine")).text
    assert "/console/quarantine/0190a0b0-0000-7000-8000-000000000001" in listing
    body = (
        await operator.http.get("/console/quarantine/0190a0b0-0000-7000-8000-000000000001")
    ).text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\xff" in body and "<script>" not in body


async def statuses(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(outbox.DELIVERIES.select())
        return {row.id: row.status for row in rows}


async def outbox_states(engine: AsyncEngine) -> dict[str, dict[str, object]]:
    async with engine.connect() as conn:
        return {row.name: dict(row._mapping) for row in await conn.execute(outbox.STATES.select())}


@pytest.mark.parametrize(
    "value",
    ["9999-12-31T23:59-14:00", "0001-01-01T00:00+14:00", "1969-12-31T00:00", "9001-01-01T00:00"],
)
async def test_times_out_of_range_are_a_400(operator: ConsoleClient, value: str) -> None:
    for path in ("/console/events", "/console/deliveries"):
        for name in ("since", "until"):
            answer = await operator.http.get(path, params={name: value})
            assert answer.status_code == 400, (path, name, answer.text)
            assert answer.json()["detail"].startswith(f"{name}:")
    answer = await operator.act("/console/deliveries/replay", since=value)
    assert answer.status_code == 400


async def test_actions_only_send_back_inside_the_console(operator: ConsoleClient) -> None:
    for back in ("/console/../metrics", "/console/%2e%2e/x", "/console/events?notice=x"):
        answer = await operator.act(
            "/console/deliveries/00000000-0000-7000-8000-000000000000/replay", back=back
        )
        assert answer.status_code == 404  # no such delivery: nothing to send back to
    for hostile in ("/console/../metrics", "/console/.%2e/x"):
        form = await operator.http.get("/console/login", params={"next": hostile})
        assert 'name="next" value="/console/events"' in form.text


async def test_no_redirect_is_built_from_the_host_header(operator: ConsoleClient) -> None:
    answer = await operator.http.get("/console/events/", headers={"host": "evil.example"})
    assert answer.status_code == 404
    assert "location" not in answer.headers


async def test_a_405_names_the_allowed_methods(operator: ConsoleClient) -> None:
    answer = await operator.http.get("/console/deliveries/replay")
    assert answer.status_code == 405 and answer.headers["allow"] == "POST"


async def test_a_bulk_replay_is_bound_to_the_count_it_confirmed(
    engine: AsyncEngine, clock: Clock, operator: ConsoleClient
) -> None:
    relay = Relay(engine, {"sink": {"type": "http", "url": "http://127.0.0.1:9/"}}, clock)
    try:
        await sms(engine, clock, 3)
        await relay.route_all()
    finally:
        await relay.aclose()
    async with engine.begin() as conn:
        await conn.execute(update(outbox.DELIVERIES).values(status=DEAD, next_attempt_at=None))
    stale = await operator.act("/console/deliveries/replay", confirm="yes", count="2")
    assert stale.status_code == 200 and "The count changed" in stale.text
    assert '<strong class="count">3</strong>' in stale.text
    assert set((await statuses(engine)).values()) == {DEAD}
    before = (START - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    early = await operator.act("/console/deliveries/replay", until=before, confirm="yes", count="0")
    assert early.status_code == 303  # nothing was created before then: nothing replayed
    assert set((await statuses(engine)).values()) == {DEAD}
    done = await operator.act("/console/deliveries/replay", confirm="yes", count="3")
    assert done.status_code == 303
    assert set((await statuses(engine)).values()) == {PENDING}
