"""The console in a real browser: Playwright driving Debian's Chromium against `relay serve`.

A real server (embedded mode, SQLite) and a real destination (the benches' sink of
``scripts/harness.py``, failing at first) run as processes; the browser logs in, finds an event
by its requestId, reads its timeline, replays its dead delivery and sees it succeed, and checks
that hostile payloads stay text. Each page is saved as a PNG under ``test-artifacts/console/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay.simulator import factories
from scripts import harness
from tests.store_support import blocking_eventually, child_environment
from tests.support import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "console"
TOKEN = "browser-test-token-0123456789"
USER, PASSWORD = "alice", "a long console password"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
XSS_TEXTS = (
    "<script>window.__xss = 1</script>",
    '"><img src=x onerror="window.__xss = 2">',
)


def chromium_path() -> str:
    """Debian's Chromium; a missing browser fails the run in CI and skips elsewhere."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    message = "chromium is not installed (apt-get install -y chromium; .ci/run does it)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def sink() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(harness.sink_argv(port), env=child_environment())
    base = f"http://127.0.0.1:{port}"
    try:
        blocking_eventually(lambda: _answers(f"{base}/_sink/healthz"))
        httpx.post(f"{base}/_sink/mode", json={"mode": "fail"})
        yield base
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def server(tmp_path: Path, sink: str) -> Iterator[dict[str, Any]]:
    yield from serve(
        tmp_path,
        sink,
        f"""
[policies.once]
type = "delays"
max_attempts = 1
delays = ["1s"]

[destinations.orders]
type = "http"
url = "{sink}/hook"
policy = "once"

[destinations.archive]
type = "http"
url = "{sink}/archive"
policy = "once"
kinds = ["sms.dlr"]
""",
    )


def serve(tmp_path: Path, sink: str, destinations: str) -> Iterator[dict[str, Any]]:
    """`relay serve` (embedded mode) with the console user and these destinations."""
    port = free_port()
    (tmp_path / "relay.toml").write_text(
        f"""
[sources.default]
token = "{TOKEN}"

[console.users]
{USER} = "{PASSWORD}"
{destinations}"""
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "relay", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=tmp_path,
        env=child_environment(),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        blocking_eventually(lambda: _answers(f"{base}/readyz"))
        yield {"base": base, "database": tmp_path / "relay.db", "sink": sink}
    finally:
        process.terminate()
        process.wait(15)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def post(server: dict[str, Any], path: str, body: dict[str, Any]) -> str:
    answer = httpx.post(f"{server['base']}/hooks{path}?token={TOKEN}", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def statuses(database: Path) -> dict[str, str]:
    with sqlite3.connect(database) as conn:
        return dict(conn.execute("SELECT event_id || '/' || destination, status FROM deliveries"))


def test_the_console_in_a_browser(server: dict[str, Any]) -> None:
    from playwright.sync_api import expect, sync_playwright

    event_id = post(server, "/sms/inbound", factories.sms_inbound({"requestId": "req-browser-1"}))
    hostile = [
        post(server, "/sms/inbound", factories.sms_inbound({"requestId": f"x-{i}", "message": t}))
        for i, t in enumerate(XSS_TEXTS)
    ]
    post(server, "/sms/dlr", factories.sms_dlr({"requestId": "req-browser-1"}))
    httpx.post(
        f"{server['base']}/hooks/sms/inbound?token={TOKEN}",
        content=b"<not json>",
        headers={"content-type": "application/json"},
    )
    key = f"{event_id}/orders"
    everything_dead = ["dead"] * 5  # three messages and a report to orders, the report to archive
    blocking_eventually(lambda: sorted(statuses(server["database"]).values()) == everything_dead)
    httpx.post(f"{server['sink']}/_sink/mode", json={"mode": "ok"})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        try:
            page.goto(f"{server['base']}/console")
            expect(page.get_by_role("heading", name="Log in to the console")).to_be_visible()
            page.screenshot(path=ARTIFACTS / "login.png")
            page.get_by_label("User").fill(USER)
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Log in").click()
            expect(page.get_by_role("heading", name="Events")).to_be_visible()
            page.screenshot(path=ARTIFACTS / "events.png", full_page=True)

            page.get_by_label("Platform id").fill("req-browser-1")
            page.get_by_role("button", name="Filter").click()
            rows = page.locator("table.list tbody tr")
            expect(rows).to_have_count(2)  # the message and its delivery report
            page.locator(f'a[href="/console/events/{event_id}"]').click()
            section = page.locator("section.delivery", has_text="orders")
            expect(section.locator(".badge")).to_have_text("dead")
            expect(section.locator("table.timeline")).to_contain_text("HTTP 500")
            page.screenshot(path=ARTIFACTS / "event.png", full_page=True)

            section.get_by_role("button", name="Replay").click()
            expect(page.get_by_role("status")).to_contain_text("Replayed")
            for _ in range(50):  # the embedded worker was woken: a reload or two
                if section.locator(".badge").inner_text() == "succeeded":
                    break
                page.wait_for_timeout(200)
                page.reload()
            expect(section.locator(".badge")).to_have_text("succeeded")
            assert statuses(server["database"])[key] == "succeeded"

            for hostile_id in hostile:
                page.goto(f"{server['base']}/console/events/{hostile_id}")
                payload = page.locator("pre.payload").first
                shown = payload.inner_text()  # the JSON of the payload, as text
                assert any(json.dumps(text)[1:-1] in shown for text in XSS_TEXTS)
                assert page.evaluate("window.__xss") is None
                assert page.locator("img").count() == 0
            assert dialogs == []

            page.goto(f"{server['base']}/console/deliveries?status=dead")
            page.screenshot(path=ARTIFACTS / "deliveries.png", full_page=True)
            bulk = page.locator("form.bulk")
            bulk.locator('select[name="destination"]').select_option("archive")
            bulk.get_by_role("button", name="Count and confirm").click()
            expect(page.locator(".count")).to_have_text("1")
            page.screenshot(path=ARTIFACTS / "confirm.png", full_page=True)
            page.get_by_role("button", name="Replay 1 delivery", exact=True).click()
            expect(page.get_by_role("status")).to_have_text("Replayed 1 delivery: it is due now.")

            page.goto(f"{server['base']}/console/destinations")
            expect(page.locator("svg.chart").first).to_be_visible()
            page.screenshot(path=ARTIFACTS / "destinations.png", full_page=True)
            page.goto(f"{server['base']}/console/quarantine")
            expect(page.locator("table.list tbody tr")).to_have_count(1)
            page.locator("table.list tbody a").click()
            expect(page.locator("pre.payload").last).to_have_text("<not json>")
            page.screenshot(path=ARTIFACTS / "quarantine.png", full_page=True)
        finally:
            browser.close()
    archive = next(key for key in statuses(server["database"]) if key.endswith("/archive"))
    blocking_eventually(lambda: statuses(server["database"])[archive] == "succeeded")
    assert json.loads(httpx.get(f"{server['sink']}/_sink/count").text)["requests"] >= 2


NARROW = 420
NARROW_PAGES = ("events", "deliveries", "deliveries?status=dead", "destinations", "quarantine")


def login(page: Any, base: str) -> None:
    page.goto(f"{base}/console/login")
    page.get_by_label("User").fill(USER)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/console/events")


def test_the_destinations_table_a_narrow_screen_and_live_counts(server: dict[str, Any]) -> None:
    """The destinations page opens with its summary table; every page fits 420 px without a
    horizontal page scroll; the events page's counts change without a reload when an event
    is stored, by the console's script under its strict CSP."""
    from playwright.sync_api import expect, sync_playwright

    event_id = post(server, "/sms/dlr", factories.sms_dlr({"requestId": "req-glance"}))
    blocking_eventually(lambda: sorted(statuses(server["database"]).values()) == ["dead"] * 2)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        refused: list[str] = []
        page.on(
            "console",
            lambda message: (
                refused.append(message.text) if "Content Security Policy" in message.text else None
            ),
        )
        try:
            login(page, server["base"])
            page.goto(f"{server['base']}/console/destinations")
            summary = page.locator("table.summary tbody tr")
            expect(summary).to_have_count(2)
            expect(summary.nth(0).locator("td")).to_have_text(
                ["orders", "http", "1 dead in the last hour", "0", "1", "0.0 %", re.compile("ms$")]
            )
            expect(summary.nth(1).locator("td.name")).to_have_text("archive")
            first = page.locator("table.summary").bounding_box()
            details = page.locator("section.destination").first.bounding_box()
            assert first is not None and details is not None and first["y"] < details["y"]
            expect(page.locator("svg.chart circle.latency").first).to_be_visible()

            page.set_viewport_size({"width": NARROW, "height": 860})
            for path in (*NARROW_PAGES, f"events/{event_id}"):
                page.goto(f"{server['base']}/console/{path}")
                width = page.evaluate("document.documentElement.scrollWidth")
                assert width <= NARROW, f"{path}: the page is {width} px wide"
            page.goto(f"{server['base']}/console/destinations")
            page.screenshot(path=ARTIFACTS / "destinations-narrow.png", full_page=True)

            page.goto(f"{server['base']}/console/events")
            newer = page.locator('[data-count="newer"]')
            expect(newer).to_have_text("")
            page.evaluate("window.__same_page = true")  # gone if the page were reloaded
            post(server, "/sms/inbound", factories.sms_inbound({"requestId": "req-live"}))
            expect(newer).to_have_text("1 newer event", timeout=20_000)
            assert page.evaluate("window.__same_page") is True
            page.screenshot(path=ARTIFACTS / "events-narrow.png", full_page=True)
            newer.click()
            expect(page.locator("table.list tbody tr")).to_have_count(2)
            assert refused == []
        finally:
            browser.close()


@pytest.fixture
def ordered_server(tmp_path: Path, sink: str) -> Iterator[dict[str, Any]]:
    """A per-key destination retrying hourly: a failed first delivery holds its line."""
    yield from serve(
        tmp_path,
        sink,
        f"""
[policies.hourly]
type = "delays"
delays = ["1h"]
give_up_after = "2h"

[destinations.crm]
type = "http"
url = "{sink}/hook"
policy = "hourly"
ordering = "per-key"
""",
    )


def by_event(database: Path) -> dict[str, tuple[str, str | None]]:
    with sqlite3.connect(database) as conn:
        return {
            event: (status, error)
            for event, status, error in conn.execute(
                "SELECT event_id, status, last_error FROM deliveries"
            )
        }


def test_giving_up_the_head_of_a_line_in_a_browser(ordered_server: dict[str, Any]) -> None:
    from playwright.sync_api import expect, sync_playwright

    server = ordered_server
    first, second, third = (
        post(server, "/sms/dlr", factories.sms_dlr({"requestId": "req-line"}, status=status))
        for status in ("ACCEPTED", "BUFFERED", "DELIVERED")
    )
    blocking_eventually(lambda: by_event(server["database"]).get(first, ("",))[0] == "pending")
    blocking_eventually(  # the first failed (the sink fails) and waits an hour; the others wait
        lambda: len(httpx.get(f"{server['sink']}/_sink/answers").json()) == 1
    )
    httpx.post(f"{server['sink']}/_sink/mode", json={"mode": "ok"})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        try:
            page.goto(f"{server['base']}/console/login")
            page.get_by_label("User").fill(USER)
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Log in").click()
            page.goto(f"{server['base']}/console/events/{first}")
            section = page.locator("section.delivery", has_text="crm")
            expect(section.locator(".badge").first).to_have_text("pending")
            section.get_by_role("button", name="Give up").click()

            expect(page.get_by_role("heading", name="Give up this delivery?")).to_be_visible()
            expect(page.locator("dd.behind")).to_have_text("2")
            page.screenshot(path=ARTIFACTS / "give-up.png", full_page=True)
            page.get_by_label("Reason (optional)").fill("the CRM rejects it")
            page.get_by_role("button", name="Give up this delivery").click()

            expect(page.get_by_role("status")).to_contain_text("Given up")
            expect(section.locator(".badge").first).to_have_text("dead")
            expect(section.get_by_role("button", name="Give up")).to_have_count(0)
        finally:
            browser.close()
    assert by_event(server["database"])[first] == (
        "dead",
        f"given up by {USER}: the CRM rejects it",
    )
    # the line moved at once: the next two went without waiting for the hour
    blocking_eventually(
        lambda: (
            [by_event(server["database"])[e][0] for e in (second, third)]
            == ["succeeded", "succeeded"]
        )
    )
