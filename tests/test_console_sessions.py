"""Console sessions live in the database: every replica sees a session begin and end.

Two replicas are two console apps, each on an engine of its own, over one database (a SQLite
file, or PostgreSQL); a browser's cookie copied from one to the other stands for a load
balancer sending the browser anywhere, or for a cookie stolen from it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from relay.cli import main
from relay.console.sessions import SESSION_COOKIE, SESSIONS
from relay.store import migrate
from tests.console_support import (
    LOGIN_TOKEN,
    PASSWORD,
    SESSION_LIFETIME,
    USER,
    ConsoleClient,
    replica,
    start_replica,
)
from tests.full_store_support import PostgresStore
from tests.relay_support import Clock
from tests.support import free_port

BOB, BOBS_PASSWORD = "bob", "bob's own long password"
BOTH = {USER: PASSWORD, BOB: BOBS_PASSWORD}


@pytest.fixture
def clock() -> Clock:
    """Now, to the second: `relay console logout-all` ends the sessions live at the real now."""
    return Clock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
async def other_engine(engine: AsyncEngine, database_url: str) -> AsyncIterator[AsyncEngine]:
    """A second engine on the test's database: another replica's connections."""
    second = create_engine(database_url)
    yield second
    await second.dispose()


async def logged_in(client: ConsoleClient, user: str = USER, password: str = PASSWORD) -> str:
    """Log ``client`` in: its session cookie."""
    assert (await client.login(user, password)).status_code == 303
    return str(client.http.cookies[SESSION_COOKIE])


async def page_of(client: ConsoleClient, cookie: str, accept: str = "*/*") -> httpx.Response:
    """The events page for a request carrying only this session cookie."""
    headers = {"cookie": f"{SESSION_COOKIE}={cookie}", "accept": accept}
    return await client.http.get("/console/events", headers=headers)


async def page_status(client: ConsoleClient, cookie: str) -> int:
    """The status of the events page for a request carrying only this session cookie."""
    return (await page_of(client, cookie)).status_code


async def live_sessions(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count = await conn.scalar(
            select(func.count()).select_from(SESSIONS).where(SESSIONS.c.ended_at.is_(None))
        )
    return int(count or 0)


async def test_a_copied_cookie_is_refused_on_every_replica_after_logout(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    first, second = replica(engine, clock), replica(other_engine, clock)
    async with first.browser() as alice, second.browser() as thief:
        cookie = await logged_in(alice)
        assert await page_status(thief, cookie) == 200  # one session, served by both replicas
        assert (await alice.act("/console/logout")).status_code == 303
        assert await page_status(thief, cookie) == 303
        assert await page_status(alice, cookie) == 303
        answer = await thief.http.post(
            "/console/destinations/sink/disable",
            data={"csrf": alice.csrf},
            headers={"cookie": f"{SESSION_COOKIE}={cookie}"},
        )
        assert answer.status_code == 403


PAGES = ("/console/events", "/console/deliveries", "/console/destinations", "/console/quarantine")


async def test_a_browser_may_use_any_replica_for_every_page_and_action(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    first, second = replica(engine, clock, ["sink"]), replica(other_engine, clock, ["sink"])
    async with first.browser() as on_first, second.browser() as on_second:
        await logged_in(on_first)
        on_second.http.cookies = on_first.http.cookies
        on_second.csrf = on_first.csrf
        for path in PAGES:
            assert (await on_second.http.get(path)).status_code == 200, path
        for action in ("disable", "enable"):
            answer = await on_second.act(f"/console/destinations/sink/{action}")
            assert answer.status_code == 303, action
        assert (await on_second.act("/console/logout")).status_code == 303
        for path in PAGES:
            assert (await on_first.http.get(path)).status_code == 303, path
        answer = await on_first.act("/console/destinations/sink/disable")
        assert answer.status_code == 403


@pytest.mark.parametrize(
    "ending", ["logout", "logout-all", "password changed", "user removed", "expiry"]
)
async def test_every_way_a_session_ends_ends_it_on_every_replica(
    engine: AsyncEngine,
    other_engine: AsyncEngine,
    clock: Clock,
    database_url: str,
    tmp_path: Path,
    ending: str,
) -> None:
    first = await start_replica(engine, clock, BOTH)
    second = await start_replica(other_engine, clock, BOTH)
    async with first.browser() as alice, second.browser() as elsewhere:
        cookie = await logged_in(alice)
        assert await page_status(elsewhere, cookie) == 200
        if ending == "logout":
            await alice.act("/console/logout")
        elif ending == "logout-all":
            result = await relay(
                "console", "logout-all", "--config", config_file(tmp_path, database_url)
            )
            assert result.output == "ended 1 console session\n"
        elif ending == "password changed":
            await start_replica(
                other_engine, clock, {USER: "alice's new password", BOB: BOBS_PASSWORD}
            )
        elif ending == "user removed":
            await start_replica(other_engine, clock, {BOB: BOBS_PASSWORD})
        else:
            clock.advance(SESSION_LIFETIME)
        # both replicas still run with the configuration alice's session was opened under
        assert await page_status(elsewhere, cookie) == 303
        assert await page_status(alice, cookie) == 303


async def test_a_session_ends_at_its_lifetime_on_every_replica(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    first, second = replica(engine, clock), replica(other_engine, clock)
    async with first.browser() as alice, second.browser() as other:
        cookie = await logged_in(alice)
        clock.advance(SESSION_LIFETIME - timedelta(seconds=1))
        assert await page_status(other, cookie) == 200
        clock.advance(timedelta(seconds=1))
        assert await page_status(other, cookie) == 303
        assert await page_status(alice, cookie) == 303


async def test_a_new_password_ends_the_old_ones_sessions_on_every_replica(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    old = await start_replica(engine, clock, BOTH)
    async with old.browser() as alice, old.browser() as bob:
        alices = await logged_in(alice)
        bobs = await logged_in(bob, BOB, BOBS_PASSWORD)
        # another replica starts with alice's new password, and without bob
        new = await start_replica(other_engine, clock, {USER: PASSWORD + " (new)"})
        async with new.browser() as elsewhere:
            assert await page_status(alice, alices) == 303  # the old replica runs on, old config
            assert await page_status(elsewhere, alices) == 303
            assert await page_status(bob, bobs) == 303
            assert (await elsewhere.login(USER, PASSWORD)).status_code == 401
            fresh = await logged_in(elsewhere, USER, PASSWORD + " (new)")
            assert await page_status(elsewhere, fresh) == 200


async def test_a_restart_with_the_same_passwords_keeps_every_session(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    first = await start_replica(engine, clock, BOTH)
    async with first.browser() as alice:
        cookie = await logged_in(alice)
        second = await start_replica(other_engine, clock, BOTH)
        async with second.browser() as other:
            assert await page_status(other, cookie) == 200
            assert await page_status(alice, cookie) == 200


async def test_a_new_login_ends_the_session_its_browser_held(
    engine: AsyncEngine, clock: Clock
) -> None:
    async with replica(engine, clock, users=BOTH).browser() as shared:
        alices = await logged_in(shared)
        bobs = await logged_in(shared, BOB, BOBS_PASSWORD)
        assert await page_status(shared, alices) == 303
        assert await page_status(shared, bobs) == 200
        assert await live_sessions(engine) == 1


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_every_console_cookie_is_http_only_strict_scoped_and_secure_over_https(
    engine: AsyncEngine, clock: Clock, scheme: str
) -> None:
    async with replica(engine, clock).browser() as alice:
        form = await alice.http.get(f"{scheme}://relay.test/console/login")
        token = LOGIN_TOKEN.search(form.text)
        assert token is not None
        login = await alice.http.post(
            f"{scheme}://relay.test/console/login",
            data={"token": token[1], "user": USER, "password": PASSWORD},
        )
    assert login.status_code == 303
    issued = {
        line.split("=", 1)[0]: line.lower().split("; ")[1:]
        for answer in (form, login)
        for line in answer.headers.get_list("set-cookie")
        if "max-age=0" not in line.lower()  # a deletion
    }
    assert set(issued) == {SESSION_COOKIE, "relay_console_login", "relay_console_device"}
    for name, attributes in issued.items():
        assert {"httponly", "path=/console", "samesite=strict"} <= set(attributes), name
        assert ("secure" in attributes) == (scheme == "https"), name


async def test_the_csrf_token_belongs_to_its_session(engine: AsyncEngine, clock: Clock) -> None:
    console = replica(engine, clock, ["sink"])
    async with console.browser() as first, console.browser() as second:
        await logged_in(first)
        await logged_in(second)
        assert first.csrf != second.csrf
        answer = await second.http.post(
            "/console/destinations/sink/disable", data={"csrf": first.csrf}
        )
        assert answer.status_code == 403
        assert (await second.act("/console/destinations/sink/disable")).status_code == 303


@pytest.mark.parametrize("token", ["é", "🙂" * 40, "\u2028", "x" * 10_000, "", " "])
async def test_hostile_form_tokens_are_refused_with_a_403(
    engine: AsyncEngine, clock: Clock, token: str
) -> None:
    async with replica(engine, clock, ["sink"]).browser() as alice:
        await alice.http.get("/console/login")
        login = await alice.http.post(
            "/console/login", data={"token": token, "user": USER, "password": PASSWORD}
        )
        assert login.status_code == 403
        await logged_in(alice)
        action = await alice.http.post("/console/destinations/sink/disable", data={"csrf": token})
        assert action.status_code == 403


async def test_the_database_keeps_no_token_and_its_ids_open_no_session(
    engine: AsyncEngine, clock: Clock
) -> None:
    async with replica(engine, clock).browser() as alice:
        cookie = await logged_in(alice)
        async with engine.connect() as conn:
            (stored,) = (await conn.execute(select(SESSIONS))).all()
        assert stored.id == hashlib.sha256(cookie.encode()).hexdigest()
        assert cookie not in {str(value) for value in stored}
        assert await page_status(alice, stored.id) == 303  # a leaked table lets no one in


@pytest.mark.parametrize(
    "cookie_header",
    [
        f"{SESSION_COOKIE}=",
        f"{SESSION_COOKIE}=" + "A" * 43,  # the shape of a token, but no session's
        f"{SESSION_COOKIE}=" + "A" * 100_000,
        f"{SESSION_COOKIE}=" + "é" * 43,
        f'{SESSION_COOKIE}="{"A" * 41}"',
        f"{SESSION_COOKIE}=%00%ff; {SESSION_COOKIE}=x",  # repeated
        f"{SESSION_COOKIE}={{'u': 'alice'}}",
    ],
)
async def test_hostile_session_cookies_are_no_session(
    engine: AsyncEngine, clock: Clock, cookie_header: str
) -> None:
    async with replica(engine, clock, ["sink"]).browser() as stranger:
        headers = {"cookie": cookie_header.encode("utf-8"), "accept": b"text/html"}
        page = await stranger.http.get("/console/events", headers=headers)
        assert page.status_code == 303
        action = await stranger.http.post(
            "/console/destinations/sink/disable", data={"csrf": "x"}, headers=headers
        )
        assert action.status_code == 403
        missing = await stranger.http.get("/console/nowhere", headers=headers)
        assert missing.status_code == 404
        assert "Log out" not in missing.text


async def test_sessions_expired_by_a_login_are_deleted(engine: AsyncEngine, clock: Clock) -> None:
    console = replica(engine, clock)
    for _ in range(3):
        async with console.browser() as browser:
            await logged_in(browser)
    assert await live_sessions(engine) == 3
    clock.advance(SESSION_LIFETIME)
    async with console.browser() as alice:
        await logged_in(alice)
        async with engine.connect() as conn:
            kept = (await conn.execute(select(SESSIONS.c.created_at))).scalars().all()
        assert kept == [clock()]


async def test_a_session_remembers_when_it_was_last_seen_once_a_minute(
    engine: AsyncEngine, clock: Clock
) -> None:
    async def last_seen() -> datetime:
        async with engine.connect() as conn:
            return (await conn.execute(select(SESSIONS.c.last_seen_at))).scalar_one()

    async with replica(engine, clock).browser() as alice:
        await logged_in(alice)
        opened = clock()
        clock.advance(timedelta(seconds=59))
        await alice.http.get("/console/events")
        assert await last_seen() == opened
        clock.advance(timedelta(seconds=1))
        await alice.http.get("/console/events")
        assert await last_seen() == clock()


# --- relay console logout-all --------------------------------------------------------------


def config_file(tmp_path: Path, database_url: str) -> str:
    path = tmp_path / "relay.toml"
    path.write_text(f'database_url = "{database_url}"\n')
    return str(path)


async def relay(*args: str) -> Result:
    """Run the `relay` command line (in a thread: it runs an event loop of its own)."""
    return await asyncio.to_thread(CliRunner().invoke, main, list(args))


async def test_logout_all_ends_the_sessions_on_every_replica_and_says_how_many(
    engine: AsyncEngine,
    other_engine: AsyncEngine,
    clock: Clock,
    database_url: str,
    tmp_path: Path,
) -> None:
    config = config_file(tmp_path, database_url)
    first, second = replica(engine, clock, users=BOTH), replica(other_engine, clock, users=BOTH)
    async with (
        first.browser() as alice,
        second.browser() as alices_laptop,
        second.browser() as bob,
        second.browser() as other,
    ):
        alices = [await logged_in(alice), await logged_in(alices_laptop)]
        bobs = await logged_in(bob, BOB, BOBS_PASSWORD)

        result = await relay("console", "logout-all", "--user", USER, "--config", config)
        assert result.exit_code == 0, result.output
        assert result.output == f"ended 2 console sessions of {USER}\n"
        for cookie in alices:
            assert await page_status(other, cookie) == 303
            assert await page_status(alice, cookie) == 303
        assert await page_status(alice, bobs) == 200

        result = await relay("console", "logout-all", "--config", config)
        assert result.output == "ended 1 console session\n"
        assert await page_status(other, bobs) == 303
        result = await relay(
            "console", "logout-all", "--user", BOB, "--user", USER, "--config", config
        )
        assert result.output == f"ended 0 console sessions of {USER}, {BOB}\n"


@pytest.mark.parametrize(
    "args",
    [
        ["--user", ""],
        ["--user", "x" * 65],
        ["--user", "a b"],
        ["--user", "al\udcffce"],
        ["--user", "alice\n"],
        ["--user"],
        ["alice"],
        ["--all"],
    ],
)
async def test_logout_all_refuses_what_cannot_be_a_user(
    engine: AsyncEngine, clock: Clock, database_url: str, tmp_path: Path, args: list[str]
) -> None:
    config = config_file(tmp_path, database_url)
    async with replica(engine, clock).browser() as alice:
        cookie = await logged_in(alice)
        result = await relay("console", "logout-all", *args, "--config", config)
        assert result.exit_code == 2
        assert "Traceback" not in result.output
        assert await page_status(alice, cookie) == 200


def test_logout_all_without_a_database_says_so(tmp_path: Path) -> None:
    config = config_file(tmp_path, f"sqlite:///{tmp_path / 'none.db'}")
    result = CliRunner().invoke(main, ["console", "logout-all", "--config", config])
    assert result.exit_code == 1
    assert "there is no database at" in result.output


# --- an unreachable database -------------------------------------------------------------


async def test_a_database_that_cannot_be_reached_is_a_503_then_the_console_recovers(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    later = tmp_path / "not-yet"  # SQLite cannot open a file in a folder that is missing
    engine = create_engine(f"sqlite:///{later / 'relay.db'}")
    try:
        async with replica(engine, clock, ["sink"]).browser() as alice:
            with caplog.at_level(logging.INFO, logger="relay.console"):
                assert (await alice.http.get("/console/login")).status_code == 200
                answers = [
                    await alice.login(),
                    await page_of(alice, "A" * 43),
                    await page_of(alice, "A" * 43, accept="text/html"),
                ]
                later.mkdir()
                await migrate.upgrade(engine)
                await logged_in(alice)
                assert (await alice.http.get("/console/events")).status_code == 200
    finally:
        await engine.dispose()
    assert [answer.status_code for answer in answers] == [503, 503, 503]
    assert all(answer.headers["retry-after"] == "5" for answer in answers)
    assert answers[1].headers["content-type"] == "application/problem+json"
    assert "cannot be reached" in answers[2].text
    assert [record.message for record in caplog.records if "database" in record.message] == [
        "console: the database cannot be reached: unable to open database file",
        "console: the database can be reached again",
    ]
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_full_store_is_a_503_that_says_so_and_is_logged_once(
    engine: AsyncEngine, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Not "cannot be reached": the database answers, and refuses writes for want of room (a
    trigger raises PostgreSQL's disk_full, as a full disk makes the server do)."""
    full = PostgresStore(engine, ("console_sessions", "console_login_throttle"))
    await full.install()
    try:
        async with replica(engine, clock).browser() as alice:
            await full.fill()
            with caplog.at_level(logging.INFO):
                answers = [await alice.login(), await alice.login(password="wrong-password")]
            await full.make_room()
            await logged_in(alice)
    finally:
        await full.remove()
    assert [answer.status_code for answer in answers] == [503, 503]
    assert all("store is full" in answer.json()["detail"] for answer in answers)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(("relay", "receivers"))]
    assert [line for line in lines if "full" in line or "reached" in line] == [
        "the store refuses the relay's writes: it is full "
        "(could not extend file: No space left on device)"
    ]
    assert "Traceback" not in caplog.text


async def test_a_postgresql_that_does_not_answer_is_a_503(clock: Clock) -> None:
    engine = create_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/relay")
    try:
        async with replica(engine, clock).browser() as alice:
            answer = await page_of(alice, "A" * 43)
            login = await alice.login()
    finally:
        await engine.dispose()
    assert (answer.status_code, login.status_code) == (503, 503)
    assert answer.json()["title"] == "Service Unavailable"
