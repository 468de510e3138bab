"""Operator commands: deliveries list/show/replay, destinations list/enable."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis import Redis
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.store.engine import create_engine
from relay import outbox
from relay.cli import main
from relay.commands import outbox as outbox_commands
from relay.commands.action_log import os_user
from relay.console.wording import attempt_outcome
from relay.dispatch.jobs import QUEUE_NAME
from relay.observe import progress
from relay.outbox import replaying
from relay.outbox.tables import DEAD, PENDING
from relay.simulator import factories
from relay.store import inspect, migrate
from tests.cli_support import table
from tests.conftest import TOKEN
from tests.relay_support import Clock, Relay, store_events
from tests.support import Answer, Sink, free_port, serving


def relay(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


async def dead_and_gone(url: str) -> tuple[str, str]:
    """One dead delivery (to `flaky`) and one held by a 410 (to `gone`)."""
    engine = create_engine(url)
    clock = Clock()
    try:
        await migrate.upgrade(engine)
        async with serving(Sink()) as sink:
            sink.answers["/flaky"] = Answer(503, body=b"broken")  # down: counted
            sink.answers["/gone"] = Answer(410)
            destinations = {
                "flaky": {"type": "http", "url": sink.url("/flaky"), "policy": "once"},
                "gone": {"type": "http", "url": sink.url("/gone")},
            }
            relay_ = Relay(
                engine,
                destinations,
                clock,
                policies={"once": {"type": "delays", "delays": ["1s"], "max_attempts": 1}},
            )
            await store_events(engine, [("/hooks/sms/dlr", factories.sms_dlr())], clock)
            due = await relay_.route_all()
            for item in due:
                await relay_.deliverer.attempt(item.id)
            await relay_.aclose()
        by_destination = {}
        for row in await inspect.list_deliveries(engine):
            by_destination[row["destination"]] = row["id"]
        return by_destination["flaky"], by_destination["gone"]
    finally:
        await engine.dispose()


@pytest.mark.slow
def test_deliveries_and_destinations_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "{url}"\n[sources.default]\ntoken = "{TOKEN}"\n'
        '[destinations.flaky]\ntype = "http"\nurl = "http://127.0.0.1:9/flaky"\n'
        '[destinations.gone]\ntype = "http"\nurl = "http://127.0.0.1:9/gone"\n'
    )
    flaky, gone = asyncio.run(dead_and_gone(url))
    c = ("--config", str(config))

    listed = json.loads(relay("deliveries", "list", "--json", *c))
    assert {r["id"] for r in listed} == {flaky, gone}
    for row in listed:
        assert {
            "id",
            "event_id",
            "destination",
            "status",
            "attempts",
            "next_attempt_at",
            "last_status_code",
        } <= set(row)
    [dead] = json.loads(relay("deliveries", "list", "--status", "dead", "--json", *c))
    assert dead["id"] == flaky and dead["attempts"] == 1 and dead["last_status_code"] == 503
    [held] = json.loads(relay("deliveries", "list", "--destination", "gone", "--json", *c))
    assert held["status"] == "held"
    listed_rows = table(relay("deliveries", "list", *c), first="ID")
    assert {row["ID"]: row["DESTINATION"] for row in listed_rows} == {
        flaky: "flaky",
        gone: "gone",
    }
    by_id = {row["ID"]: row for row in listed_rows}
    assert by_id[flaky]["STATUS"] == "dead" and by_id[flaky]["ATTEMPTS"] == "1"
    assert by_id[flaky]["NEXT ATTEMPT (UTC)"] == "-" and by_id[flaky]["LAST"] == "HTTP 503"
    assert by_id[gone]["STATUS"] == "held" and by_id[gone]["LAST"] == "HTTP 410"

    shown = json.loads(relay("deliveries", "show", flaky, "--json", *c))
    [attempt] = shown["attempt_log"]
    assert attempt["status_code"] == 503 and attempt["response_excerpt"] == "broken"
    text = relay("deliveries", "show", flaky, *c)
    assert re.search(r"^attempts: +1$", text, re.MULTILINE)
    assert len(re.findall(r"^attempts\b", text, re.MULTILINE)) == 1
    assert "attempt log: 1 attempt\n" in text
    [logged] = table(text, first="#")
    assert logged["#"] == "1" and logged["OUTCOME"] == "HTTP 503"
    assert logged["DURATION"].endswith(" ms")

    destinations = {d["name"]: d for d in json.loads(relay("destinations", "list", "--json", *c))}
    assert destinations["gone"]["disabled"] is True
    assert destinations["flaky"]["consecutive_failures"] == 1
    for row in destinations.values():
        assert {"name", "consecutive_failures", "paused_until", "disabled"} <= set(row)
    shown_destinations = {
        row["NAME"]: row for row in table(relay("destinations", "list", *c), first="NAME")
    }
    assert shown_destinations["gone"]["DISABLED"] == "410 Gone"
    assert shown_destinations["flaky"]["DISABLED"] == "no"
    assert shown_destinations["flaky"]["FAILURES"] == "1"
    assert shown_destinations["flaky"]["TARGET"] == "http://127.0.0.1:9/flaky"

    assert "replayed 1 delivery" in relay("deliveries", "replay", "--status", "dead", *c)
    [replayed] = json.loads(relay("deliveries", "list", "--destination", "flaky", "--json", *c))
    assert replayed["status"] == "pending" and replayed["next_attempt_at"] is not None
    [due] = table(relay("deliveries", "list", "--destination", "flaky", *c), first="ID")
    assert due["STATUS"] == "pending" and due["ATTEMPTS"] == "1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", due["NEXT ATTEMPT (UTC)"])
    assert "1 held delivery released" in relay("destinations", "enable", "gone", *c)
    [released] = json.loads(relay("deliveries", "list", "--destination", "gone", "--json", *c))
    assert released["status"] == "pending"
    assert not json.loads(relay("destinations", "list", "--json", *c))[1]["disabled"]
    assert "replayed 1" in relay("deliveries", "replay", flaky, *c)


def test_replay_needs_a_target_and_unknown_names_are_errors(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "r.db"}"\n[sources.default]\ntoken = "{TOKEN}"\n'
    )
    relay("db", "upgrade", "--config", str(config))
    runner = CliRunner()
    assert runner.invoke(main, ["deliveries", "replay", "--config", str(config)]).exit_code == 2
    missing = runner.invoke(main, ["deliveries", "replay", "nope", "--config", str(config)])
    assert missing.exit_code == 1 and "unknown ids" in missing.output
    unknown = runner.invoke(main, ["destinations", "enable", "crm", "--config", str(config)])
    assert unknown.exit_code == 1 and "no destination 'crm'" in unknown.output
    shown = runner.invoke(main, ["deliveries", "show", "nope", "--config", str(config)])
    assert shown.exit_code == 1 and "no delivery nope" in shown.output


@pytest.mark.slow
def test_replay_with_redis_unreachable_is_kept_for_the_sweepers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "{url}"\nredis_url = "redis://:hunter2@127.0.0.1:{free_port()}/0"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        '[destinations.flaky]\ntype = "http"\nurl = "http://127.0.0.1:9/flaky"\n'
        '[destinations.gone]\ntype = "http"\nurl = "http://127.0.0.1:9/gone"\n'
    )
    flaky, _ = asyncio.run(dead_and_gone(url))

    result = CliRunner().invoke(main, ["deliveries", "replay", flaky, "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "replayed 1" in result.stdout
    [warning, logged] = result.stderr.splitlines()
    assert warning.startswith("warning: cannot connect to Redis at redis://127.0.0.1:")
    assert "the workers' sweepers enqueue them" in warning and "hunter2" not in result.stderr
    user = os_user()
    assert logged.endswith(f"relay.cli: cli: {user} replayed 1 delivery ({flaky}) user={user}")
    [replayed] = json.loads(
        relay("deliveries", "list", "--destination", "flaky", "--json", "--config", str(config))
    )
    assert replayed["status"] == "pending"


PROGRESS_REDIS_URL = os.environ.get(
    "RELAY_TEST_PROGRESS_REDIS_URL", "redis://127.0.0.1:6379/12"
)  # a db of this test's own: it is flushed


async def dead_deliveries(engine: AsyncEngine, count: int) -> list[str]:
    """``count`` events routed to one destination, their deliveries made dead by hand."""
    clock = Clock()
    posts = [("/hooks/sms/dlr", factories.sms_dlr()) for _ in range(count)]
    await store_events(engine, posts, clock)
    relay_ = Relay(engine, {"crm": {"type": "http", "url": "http://127.0.0.1:9/crm"}}, clock)
    try:
        due = await relay_.route_all()
    finally:
        await relay_.aclose()
    async with engine.begin() as conn:
        await conn.execute(update(outbox.DELIVERIES).values(status=DEAD))
    return sorted(d.id for d in due)


async def test_replay_works_in_chunks_and_tells_its_progress(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await dead_deliveries(engine, 5)
    monkeypatch.setattr(replaying, "LOOKUP_CHUNK", 2)
    told: list[tuple[int, int]] = []

    due = await outbox.replay(
        engine, Clock()(), status=DEAD, progress=lambda done, total: told.append((done, total))
    )

    assert told == [(0, 5), (2, 5), (4, 5), (5, 5)]
    assert sorted(d.id for d in due) == ids
    rows = await inspect.list_deliveries(engine)
    assert {r["status"] for r in rows} == {PENDING}
    told.clear()
    again = await outbox.replay(
        engine,
        Clock()(),
        delivery_ids=[ids[0], ids[0], "nope"],  # an id twice is replayed once
        progress=lambda done, total: told.append((done, total)),
    )
    assert [d.id for d in again] == [ids[0]] and told == [(0, 2), (2, 2)]
    assert await outbox.replay(engine, Clock()(), status=DEAD) == []  # none is dead any more


def replay_config(tmp_path: Path, redis_url: str | None = None) -> tuple[str, Path]:
    """A SQLite database URL and a config file for it (and ``redis_url``)."""
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    config = tmp_path / "relay.toml"
    redis = f'redis_url = "{redis_url}"\n' if redis_url else ""
    config.write_text(
        f'database_url = "{url}"\n{redis}[sources.default]\ntoken = "{TOKEN}"\n'
        '[destinations.crm]\ntype = "http"\nurl = "http://127.0.0.1:9/crm"\n'
    )
    return url, config


async def migrated_dead_deliveries(url: str, count: int) -> list[str]:
    engine = create_engine(url)
    try:
        await migrate.upgrade(engine)
        return await dead_deliveries(engine, count)
    finally:
        await engine.dispose()


async def broker_attempts(url: str) -> str:
    """A delivery with two attempts of a broker (no HTTP status): one failed, one delivered."""
    [delivery_id] = await migrated_dead_deliveries(url, 1)
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                insert(outbox.ATTEMPTS),
                [
                    {
                        "delivery_id": delivery_id,
                        "number": number,
                        "started_at": Clock()(),
                        "duration_ms": 1.5,
                        "status_code": None,
                        "error": error,
                    }
                    for number, error in [(1, "connection refused by the broker"), (2, None)]
                ],
            )
    finally:
        await engine.dispose()
    return delivery_id


def test_deliveries_show_words_a_broker_attempt_as_the_console_does(tmp_path: Path) -> None:
    url, config = replay_config(tmp_path)
    delivery_id = asyncio.run(broker_attempts(url))

    shown = relay("deliveries", "show", delivery_id, "--config", str(config))

    assert [row["OUTCOME"] for row in table(shown, first="#")] == [
        "connection refused by the broker",
        attempt_outcome(None, None),
    ]
    assert attempt_outcome(None, None) == "delivered"


def test_replay_and_enable_log_one_line_each_as_the_console_words_it(tmp_path: Path) -> None:
    url, config = replay_config(tmp_path)
    ids = asyncio.run(migrated_dead_deliveries(url, 3))
    c = ("--config", str(config))
    runner, user = CliRunner(), os_user()

    chosen = runner.invoke(
        main, ["deliveries", "replay", "--status", "dead", "--destination", "crm", *c,
               "--since", "2020-01-02"],
    )  # fmt: skip
    named = runner.invoke(main, ["deliveries", "replay", ids[0], ids[1], ids[0], *c])
    enabled = runner.invoke(main, ["destinations", "enable", "crm", *c])

    assert chosen.exit_code == named.exit_code == enabled.exit_code == 0
    assert chosen.stderr.splitlines()[-1].endswith(
        f"INFO relay.cli: cli: {user} replayed 3 dead deliveries "
        f"(status=dead&destination=crm&since=2020-01-02T00%3A00%3A00) "
        f"destination=crm user={user}"
    )
    assert named.stderr.splitlines()[-1].endswith(
        f"cli: {user} replayed 2 deliveries ({ids[0]}, {ids[1]}) user={user}"
    )
    assert enabled.stderr.splitlines()[-1].endswith(
        f"cli: {user} enabled destination crm (0 held deliveries released) "
        f"destination=crm user={user}"
    )


def test_a_replay_logs_what_was_typed_escaped_on_one_line(tmp_path: Path) -> None:
    url, config = replay_config(tmp_path)
    asyncio.run(migrated_dead_deliveries(url, 1))
    many = [f"id-{n}" for n in range(25)]
    typed = ["a\nforged INFO line", "\x1b[2J", "x" * 5000, *many]

    result = CliRunner().invoke(main, ["deliveries", "replay", *typed, "--config", str(config)])

    [logged, error] = result.stderr.splitlines()
    assert result.exit_code == 1 and error == "Error: replayed 0 of 28: unknown ids"
    assert "replayed 0 deliveries (a\\x0aforged INFO line, \\x1b[2J, " + "x" * 60 + "..." in logged
    assert "and 18 more)" in logged and "id-6" in logged and "id-7" not in logged
    assert "\x1b" not in result.stderr and len(logged) < 1000


@pytest.mark.parametrize(
    ("variables", "shown"),
    [
        ({"RELAY_LOG_FORMAT": "json"}, "json"),
        ({"RELAY_LOG_LEVEL": "warning"}, "nothing"),
        ({"RELAY_LOG_LEVEL": ""}, "text"),
        ({"RELAY_LOG_LEVEL": "loud"}, "refused"),
        ({"RELAY_LOG_FORMAT": "xml\x1b"}, "refused"),
        ({"RELAY_LOG_LEVEL": "INFO"}, "refused"),
    ],
)
def test_the_action_log_follows_the_log_variables_and_a_bad_one_stops_first(
    tmp_path: Path, variables: dict[str, str], shown: str
) -> None:
    url, config = replay_config(tmp_path)
    [dead] = asyncio.run(migrated_dead_deliveries(url, 1))
    result = CliRunner().invoke(
        main, ["deliveries", "replay", dead, "--config", str(config)], env=variables
    )
    [status] = {row["status"] for row in json.loads(relay("deliveries", "list", "--json",
                                                            "--config", str(config)))}  # fmt: skip
    if shown == "refused":
        assert result.exit_code == 2 and status == DEAD  # nothing was replayed
        [name] = variables
        assert f"${name} is none of" in result.stderr and "\x1b" not in result.stderr
        return
    assert result.exit_code == 0 and status == PENDING
    if shown == "nothing":
        assert result.stderr == ""
    elif shown == "json":
        line = json.loads(result.stderr)
        assert line["logger"] == "relay.cli" and line["level"] == "info"
        assert line["message"] == f"cli: {os_user()} replayed 1 delivery ({dead})"
        assert line["user"] == os_user()
    else:
        assert result.stderr.endswith(f"cli: {os_user()} replayed 1 delivery ({dead}) "
                                      f"user={os_user()}\n")  # fmt: skip


def test_replay_shows_a_progress_bar_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, config = replay_config(tmp_path)
    asyncio.run(migrated_dead_deliveries(url, 5))
    monkeypatch.setattr(replaying, "LOOKUP_CHUNK", 2)
    runner = CliRunner()

    c = ("--config", str(config))

    piped = runner.invoke(main, ["deliveries", "replay", "--status", "dead", *c])
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    shown = runner.invoke(main, ["deliveries", "replay", "--status", "pending", *c])

    assert piped.exit_code == 0 and shown.exit_code == 0, piped.output + shown.output
    assert piped.stdout.startswith("replayed 5 deliveries")
    user = os_user()
    logged = f"cli: {user} replayed 5 dead deliveries (status=dead) user={user}\n"
    assert piped.stderr.endswith(logged)
    assert "replaying" not in piped.stderr
    assert shown.stdout.startswith("replayed 5 deliveries")
    assert "replaying" in shown.stderr and "2/5" in shown.stderr and "5/5" in shown.stderr
    assert "enqueueing" not in shown.stderr  # embedded mode: nothing to enqueue here


def test_enqueueing_many_replayed_deliveries_shows_its_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, config = replay_config(tmp_path, PROGRESS_REDIS_URL)
    asyncio.run(migrated_dead_deliveries(url, 5))
    monkeypatch.setattr(outbox_commands, "ENQUEUE_BATCH", 2)
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    args = ["deliveries", "replay", "--status", "dead", "--config", str(config)]
    with Redis.from_url(PROGRESS_REDIS_URL) as redis:
        redis.flushdb()
        try:
            ran = CliRunner().invoke(main, args)
            queued = redis.zcard(QUEUE_NAME)
        finally:
            redis.flushdb()

    assert ran.exit_code == 0, ran.output
    assert ran.stdout == "replayed 5 deliveries\n"
    assert "enqueueing" in ran.stderr and "4/5" in ran.stderr and "5/5" in ran.stderr
    assert queued == 5


def test_with_redis_unreachable_many_replayed_deliveries_get_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, config = replay_config(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    asyncio.run(migrated_dead_deliveries(url, 5))
    monkeypatch.setattr(outbox_commands, "ENQUEUE_BATCH", 2)
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)

    ran = CliRunner().invoke(
        main, ["deliveries", "replay", "--status", "dead", "--config", str(config)]
    )

    assert ran.exit_code == 0, ran.output
    assert ran.stdout == "replayed 5 deliveries\n"
    assert ran.stderr.count("warning: cannot connect to Redis") == 1
    assert "enqueueing" not in ran.stderr
