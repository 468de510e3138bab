"""The console's login throttle: counted in the database, so every replica shares it; per
client address and per user name, with delays that grow; and unable to lock a user out of a
browser they logged in from (its device cookie).

What the rule guarantees, as these tests check it:

- one address (any user names) or one user name (any addresses) gets 5 failures free, then
  waits 1 s, 2 s, 4 s ... up to 15 minutes between tries, on every replica alike;
- a browser holding a user's device cookie (it logged in as that user within 30 days) is
  delayed only by its own failures: a stranger guessing that user's password, from anywhere
  (even the user's own address), never delays it;
- any other browser trying that user waits for the user's delay (it is slowed, and gets in
  with the right password once the wait is over).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from ipaddress import ip_address

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from relay.console.login_cookies import DEVICE_COOKIE, DEVICE_LIFETIME
from relay.console.throttle import THROTTLE, LoginThrottle
from relay.console.throttle_rule import (
    FORGET_AFTER,
    FREE_FAILURES,
    LONGEST_DELAY,
    address_key,
    delay_after,
    login_attempt,
)
from tests.console_support import LOGIN_TOKEN, PASSWORD, USER, ConsoleClient, replica
from tests.relay_support import Clock

BOB, BOBS_PASSWORD = "bob", "bob's own long password"
BOTH = {USER: PASSWORD, BOB: BOBS_PASSWORD}
HOME = "192.0.2.10"
ATTACKER = "203.0.113.66"
ELSEWHERE = "198.51.100.7"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def other_engine(engine: AsyncEngine, database_url: str) -> AsyncIterator[AsyncEngine]:
    """A second engine on the test's database: another replica's connections."""
    second = create_engine(database_url)
    yield second
    await second.dispose()


async def fail(client: ConsoleClient, user: str = USER) -> httpx.Response:
    return await client.login(user, "not the password")


def retry_after(answer: httpx.Response) -> int:
    assert answer.status_code == 429, answer.status_code
    return int(answer.headers["retry-after"])


async def refused_after_failing(client: ConsoleClient, user: str = USER) -> int:
    """Fail until the throttle refuses: how many failures that took."""
    for failures in range(100):
        if (await fail(client, user)).status_code == 429:
            return failures
    raise AssertionError("never refused after 100 failures")


async def keys(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(THROTTLE.c.key, THROTTLE.c.failures))
    return {row.key: row.failures for row in rows}


# --- the rule ---------------------------------------------------------------------------


def test_delays_start_after_five_failures_and_double_up_to_fifteen_minutes() -> None:
    assert [delay_after(n) for n in range(FREE_FAILURES)] == [timedelta(0)] * FREE_FAILURES
    assert delay_after(FREE_FAILURES) == timedelta(seconds=1)
    for failures in range(FREE_FAILURES, 10_000):
        assert delay_after(failures + 1) == min(2 * delay_after(failures), LONGEST_DELAY)
    assert delay_after(10**9) == LONGEST_DELAY == timedelta(minutes=15)


def test_an_ipv6_client_is_counted_by_its_64_and_a_mapped_ipv4_as_ipv4() -> None:
    same = {address_key(ip_address(a)) for a in ("2001:db8:1:2::1", "2001:db8:1:2:ffff::9")}
    assert len(same) == 1
    assert address_key(ip_address("2001:db8:1:3::1")) not in same
    assert address_key(ip_address("::ffff:203.0.113.5")) == address_key(ip_address("203.0.113.5"))
    assert address_key(None) == "address:unknown"


def test_only_a_name_that_could_be_a_user_gets_a_key_and_keys_stay_short() -> None:
    address = ip_address(ATTACKER)
    for hostile in ("", "x" * 10_000, "a b", "al\x00ice", "ålice", "alice\n"):
        assert login_attempt(hostile, address, None).keys == (f"address:{ATTACKER}",)
    assert login_attempt("mallory", address, None).keys == (f"address:{ATTACKER}", "user:mallory")


# --- shared by replicas, growing ---------------------------------------------------------


async def test_replicas_share_the_counts(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    first, second = replica(engine, clock), replica(other_engine, clock)
    async with first.browser(ATTACKER) as one, second.browser(ATTACKER) as two:
        for _ in range(2 * FREE_FAILURES):
            await fail(one)
        assert retry_after(await two.login()) == 1  # the right password, there, waits too
    async with first.browser(ELSEWHERE) as one, second.browser(ELSEWHERE) as two:
        for tried in range(FREE_FAILURES):  # spread over both
            assert (await fail(one if tried % 2 else two, "mallory")).status_code == 401
        assert retry_after(await fail(one, "mallory")) == 1
        assert retry_after(await fail(two, "mallory")) == 1


async def test_each_failure_after_the_fifth_doubles_the_wait(
    engine: AsyncEngine, clock: Clock
) -> None:
    async with replica(engine, clock).browser(ATTACKER) as attacker:
        for _ in range(FREE_FAILURES):
            assert (await fail(attacker)).status_code == 401
        waits = []
        for _ in range(14):
            wait = retry_after(await fail(attacker))
            waits.append(wait)
            assert retry_after(await fail(attacker)) == wait  # a refused try is not counted
            clock.advance(timedelta(seconds=wait - 1))
            assert retry_after(await fail(attacker)) == 1
            clock.advance(timedelta(seconds=1))
            assert (await fail(attacker)).status_code == 401
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900, 900, 900]


async def test_concurrent_attempts_cannot_slip_through_one_gap(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    replicas = [replica(engine, clock), replica(other_engine, clock)]
    async with contextlib.AsyncExitStack() as stack:
        browsers = [
            await stack.enter_async_context(replicas[n % 2].browser(ATTACKER)) for n in range(30)
        ]
        forms = []
        for browser in browsers:
            token = LOGIN_TOKEN.search((await browser.http.get("/console/login")).text)
            assert token is not None
            forms.append({"token": token[1], "user": USER, "password": "wrong", "next": ""})
        answers = await asyncio.gather(
            *(b.http.post("/console/login", data=f) for b, f in zip(browsers, forms, strict=True))
        )
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [401] * FREE_FAILURES + [429] * (30 - FREE_FAILURES)


# --- addresses, users, devices -------------------------------------------------------------


async def test_one_address_guessing_many_users_waits_alone(
    engine: AsyncEngine, clock: Clock
) -> None:
    console = replica(engine, clock, users=BOTH)
    async with console.browser(ATTACKER) as attacker, console.browser(ELSEWHERE) as alice:
        for name in (USER, BOB, "mallory", "root", "admin"):
            assert (await fail(attacker, name)).status_code == 401
        assert retry_after(await fail(attacker, "someone-else")) == 1
        assert (await alice.login()).status_code == 303


async def test_many_addresses_guessing_one_user_make_that_user_wait(
    engine: AsyncEngine, clock: Clock
) -> None:
    console = replica(engine, clock, users=BOTH)
    for n in range(FREE_FAILURES):
        async with console.browser(f"203.0.113.{n + 1}") as attacker:
            assert (await fail(attacker)).status_code == 401
    async with console.browser(ELSEWHERE) as fresh:
        assert retry_after(await fresh.login()) == 1  # alice, even with her password, waits
        assert (await fresh.login(BOB, BOBS_PASSWORD)).status_code == 303  # bob does not
        clock.advance(timedelta(seconds=1))
        assert (await fresh.login()).status_code == 303  # slowed, not locked out


async def test_a_stranger_cannot_lock_a_user_out_of_a_browser_they_logged_in_from(
    engine: AsyncEngine, clock: Clock
) -> None:
    console = replica(engine, clock)
    async with (
        console.browser(HOME) as alice,
        console.browser(HOME) as neighbour,  # behind the same NAT as alice
        console.browser(ATTACKER) as attacker,
    ):
        assert (await alice.login()).status_code == 303
        assert (await alice.act("/console/logout")).status_code == 303
        for _ in range(12):  # both keep guessing as fast as the throttle lets them
            for stranger in (neighbour, attacker):
                answer = await fail(stranger)
                if answer.status_code == 429:
                    clock.advance(timedelta(seconds=retry_after(answer)))
                    assert (await fail(stranger)).status_code == 401
        for stranger in (neighbour, attacker):
            await refused_after_failing(stranger)
        assert (await alice.login()).status_code == 303
        assert retry_after(await neighbour.login()) > 0  # no device cookie: alice's delay


async def test_a_browser_with_a_device_cookie_is_throttled_by_its_own_failures(
    engine: AsyncEngine, other_engine: AsyncEngine, clock: Clock
) -> None:
    first, second = replica(engine, clock), replica(other_engine, clock)
    async with first.browser(HOME) as alice, second.browser(ELSEWHERE) as elsewhere:
        assert (await alice.login()).status_code == 303
        for _ in range(FREE_FAILURES):
            assert (await fail(alice)).status_code == 401
        assert retry_after(await alice.login()) == 1
        assert (await elsewhere.login()).status_code == 303  # its failures were not alice's
        elsewhere.http.cookies.clear()
        elsewhere.http.cookies.set(DEVICE_COOKIE, alice.http.cookies[DEVICE_COOKIE])
        assert retry_after(await elsewhere.login()) == 1  # the cookie is what is throttled
        clock.advance(timedelta(seconds=1))
        assert (await alice.login()).status_code == 303
        for _ in range(FREE_FAILURES):  # its new cookie starts afresh
            assert (await fail(alice)).status_code == 401


async def test_a_device_cookie_vouches_for_its_own_user_for_thirty_days(
    engine: AsyncEngine, clock: Clock
) -> None:
    console = replica(engine, clock, users=BOTH)
    async with console.browser(HOME) as alice:
        assert (await alice.login()).status_code == 303
        for n in range(FREE_FAILURES):  # bob's key and this address's, not alice's cookie's
            async with console.browser(f"203.0.113.{n + 1}") as attacker:
                await fail(attacker, BOB)
                await fail(attacker, USER)
        assert retry_after(await alice.login(BOB, BOBS_PASSWORD)) == 1
        assert (await alice.login()).status_code == 303
        for cookie in ("forged", alice.http.cookies[DEVICE_COOKIE][:-3] + "xyz", "x" * 5000):
            async with console.browser(HOME) as other:
                other.http.cookies.set(DEVICE_COOKIE, cookie)
                assert retry_after(await other.login()) == 1
        clock.advance(DEVICE_LIFETIME - timedelta(seconds=1))
        for n in range(FREE_FAILURES):
            async with console.browser(f"203.0.113.{n + 1}") as attacker:
                await fail(attacker, USER)
        assert (await alice.login()).status_code == 303
        clock.advance(DEVICE_LIFETIME)
        for n in range(FREE_FAILURES):
            async with console.browser(f"203.0.113.{n + 1}") as attacker:
                await fail(attacker, USER)
        assert retry_after(await alice.login()) == 1  # too old: an unknown browser again


async def test_a_users_login_does_not_clear_the_failures_of_others(
    engine: AsyncEngine, clock: Clock
) -> None:
    console = replica(engine, clock)
    for n in range(FREE_FAILURES - 1):
        async with console.browser(f"203.0.113.{n + 1}") as attacker:
            assert (await fail(attacker)).status_code == 401
    async with console.browser(ELSEWHERE) as alice:
        assert (await alice.login()).status_code == 303
    clock.advance(timedelta(seconds=1))  # her attempt counted, as any, until it succeeded
    async with console.browser("203.0.113.100") as attacker:
        assert (await fail(attacker)).status_code == 401
    async with console.browser("203.0.113.101") as attacker:
        assert retry_after(await fail(attacker)) == 1


async def test_behind_a_trusted_proxy_each_client_is_counted_by_its_own_address(
    engine: AsyncEngine, clock: Clock
) -> None:
    console = replica(engine, clock, trusted_proxies=["127.0.0.1/32"])
    async with console.browser("127.0.0.1") as proxied, console.browser(HOME) as direct:
        proxied.http.headers["x-forwarded-for"] = ATTACKER
        for n in range(2 * FREE_FAILURES):
            await fail(proxied, f"name-{n}")
        assert retry_after(await fail(proxied, "another")) > 0
        proxied.http.headers["x-forwarded-for"] = ELSEWHERE
        assert (await proxied.login()).status_code == 303
        for n in range(FREE_FAILURES):  # an untrusted peer's X-Forwarded-For is ignored
            direct.http.headers["x-forwarded-for"] = f"198.51.100.{n + 100}"
            await fail(direct, f"other-{n}")
        assert retry_after(await fail(direct, "more")) > 0


async def test_the_wait_is_a_429_problem_or_a_page_with_retry_after(
    engine: AsyncEngine, clock: Clock
) -> None:
    async with replica(engine, clock).browser(ATTACKER) as attacker:
        for _ in range(FREE_FAILURES):
            await fail(attacker)
        answer = await fail(attacker)
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["status"] == 429
        assert "try again in 1 s" in answer.json()["detail"]
        attacker.http.headers["accept"] = "text/html"
        page = await fail(attacker)
        assert page.status_code == 429 and page.headers["retry-after"] == "1"
        assert "try again in 1 s" in page.text


# --- bounded --------------------------------------------------------------------------------


async def test_the_table_is_bounded_and_never_drops_a_configured_users_key(
    engine: AsyncEngine, clock: Clock
) -> None:
    throttle = LoginThrottle(engine, clock, kept_keys=["user:alice"], max_keys=10)
    assert await throttle.begin(login_attempt(USER, ip_address(HOME), None)) == 0
    for n in range(50):
        clock.advance(timedelta(seconds=1))
        await throttle.begin(login_attempt(f"mallory{n}", ip_address(f"203.0.113.{n}"), None))
    await throttle.prune()
    kept = await keys(engine)
    assert len(kept) == 10 + 1
    assert kept["user:alice"] == 1
    assert "address:203.0.113.49" in kept and "address:203.0.113.39" not in kept
    clock.advance(FORGET_AFTER + timedelta(seconds=1))
    await throttle.prune()
    assert await keys(engine) == {}


async def test_logins_forget_keys_a_day_after_their_last_attempt(
    engine: AsyncEngine, clock: Clock
) -> None:
    console = replica(engine, clock)
    for n in range(3):
        async with console.browser(f"203.0.113.{n}") as attacker:
            await fail(attacker, f"name-{n}")
    assert len(await keys(engine)) == 6
    clock.advance(FORGET_AFTER + timedelta(seconds=1))
    async with console.browser(ATTACKER) as attacker:
        await fail(attacker, "mallory")
    assert await keys(engine) == {f"address:{ATTACKER}": 1, "user:mallory": 1}


# --- hostile input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "user",
    ["", "x" * 15_000, "ålice", "al\x00ice", "alice\r\nSet-Cookie: x=1", "' OR 1=1 --", USER + " "],
)
async def test_hostile_user_names_are_wrong_logins_with_a_bounded_key(
    engine: AsyncEngine, clock: Clock, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with replica(engine, clock).browser(ATTACKER) as attacker:
        with caplog.at_level(logging.WARNING, logger="relay.console"):
            answer = await attacker.login(user, "a secret guess")
        assert answer.status_code == 401
        assert all(len(key) <= 100 for key in await keys(engine))
        assert len(caplog.records) == 1
        assert "a secret guess" not in caplog.text
        assert len(caplog.text) < 400


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"user=alice&user=bob&password=x&token=t", "application/x-www-form-urlencoded"),
        (b'{"user": "alice", "password": "x"}', "application/json"),
        (b"user=al\xffice&password=x", "application/x-www-form-urlencoded"),
        (b"user=" + b"a" * 20_000, "application/x-www-form-urlencoded"),
        (b"", ""),
    ],
)
async def test_bad_login_forms_are_a_400_and_count_nothing(
    engine: AsyncEngine, clock: Clock, content: bytes, content_type: str
) -> None:
    async with replica(engine, clock).browser(ATTACKER) as attacker:
        await attacker.http.get("/console/login")
        answer = await attacker.http.post(
            "/console/login", content=content, headers={"content-type": content_type}
        )
        assert answer.status_code == 400
        assert answer.headers["content-type"] == "application/problem+json"
    assert await keys(engine) == {}


async def test_the_login_takes_get_and_post_only(engine: AsyncEngine, clock: Clock) -> None:
    async with replica(engine, clock).browser(ATTACKER) as attacker:
        for method in ("PUT", "DELETE", "PATCH"):
            answer = await attacker.http.request(method, "/console/login")
            assert answer.status_code == 405
            assert set(answer.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}
        answer = await attacker.http.get(
            "/console/login", params={"user": USER, "password": PASSWORD}
        )
        assert answer.status_code == 200
        assert "relay_console" not in answer.cookies
