"""Operator commands: deliveries list/show/replay, destinations list/enable."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from receivers.store.engine import create_engine
from relay import inspect, migrate
from relay.cli import main
from relay.simulator import factories
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
            sink.answers["/flaky"] = Answer(500, body=b"broken")
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
    assert dead["id"] == flaky and dead["attempts"] == 1 and dead["last_status_code"] == 500
    [held] = json.loads(relay("deliveries", "list", "--destination", "gone", "--json", *c))
    assert held["status"] == "held"
    assert "flaky" in relay("deliveries", "list", *c)

    shown = json.loads(relay("deliveries", "show", flaky, "--json", *c))
    [attempt] = shown["attempt_log"]
    assert attempt["status_code"] == 500 and attempt["response_excerpt"] == "broken"
    assert "#1" in relay("deliveries", "show", flaky, *c)

    destinations = {d["name"]: d for d in json.loads(relay("destinations", "list", "--json", *c))}
    assert destinations["gone"]["disabled"] is True
    assert destinations["flaky"]["consecutive_failures"] == 1
    for row in destinations.values():
        assert {"name", "consecutive_failures", "paused_until", "disabled"} <= set(row)

    assert "replayed 1 deliveries" in relay("deliveries", "replay", "--status", "dead", *c)
    [replayed] = json.loads(relay("deliveries", "list", "--destination", "flaky", "--json", *c))
    assert replayed["status"] == "pending" and replayed["next_attempt_at"] is not None
    assert "1 held deliveries released" in relay("destinations", "enable", "gone", *c)
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
    [warning] = result.stderr.splitlines()
    assert warning.startswith("warning: cannot connect to Redis at redis://127.0.0.1:")
    assert "the workers' sweepers enqueue them" in warning and "hunter2" not in warning
    [replayed] = json.loads(
        relay("deliveries", "list", "--destination", "flaky", "--json", "--config", str(config))
    )
    assert replayed["status"] == "pending"
