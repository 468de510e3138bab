"""The `relay` command line: inspection, migrations, configuration errors, first start."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from receivers.config import SOURCE_NAME_LENGTH
from receivers.store.engine import create_engine
from receivers.store.tables import ReceivedEvent, RejectedBody
from relay.cli import main
from relay.outbox.tables import Delivery, DestinationState
from relay.server.bootstrap import generated_token
from relay.settings import NAME_LENGTH, SettingsError, config_path, load_settings
from relay.simulator import factories
from relay.store import migrate
from tests.cli_support import table as cli_table
from tests.conftest import PG_ADMIN_DSN, TOKEN, running_client, service_missing
from tests.store_support import child_environment
from tests.support import free_port


def write_config(tmp_path: Path, database_url: str, extra: str = "") -> Path:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "{database_url}"\n{extra}[sources.default]\ntoken = "{TOKEN}"\n'
    )
    return config


def relay(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


async def store_some(database_url: str) -> tuple[list[str], dict[str, object]]:
    engine = create_engine(database_url)
    inbound = factories.sms_inbound()
    try:
        async with running_client(engine) as client:
            ids = [
                (await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=inbound)).json()["id"],
                (
                    await client.post(f"/hooks/sms/dlr?token={TOKEN}", json=factories.sms_dlr())
                ).json()["id"],
                (await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=inbound)).json()["id"],
            ]
            await client.post(f"/hooks/numinfo/gnp?token={TOKEN}", content=b"{broken")
    finally:
        await engine.dispose()
    return ids, inbound


def test_events_list_show_and_rejected_list(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    config = str(write_config(tmp_path, url))
    assert migrate.head_revision() in relay("db", "upgrade", "--config", config)
    ids, inbound = asyncio.run(store_some(url))

    listed = json.loads(relay("events", "list", "--json", "--config", config))
    assert {e["id"] for e in listed} == set(ids)
    for event in listed:
        assert {"id", "source", "kind", "dedup_key", "received_at", "duplicates", "payload"} <= set(
            event
        )
    only_dlr = json.loads(
        relay("events", "list", "--kind", "sms.dlr", "--json", "--config", config)
    )
    assert [e["id"] for e in only_dlr] == [ids[1]]
    assert json.loads(relay("events", "list", "--limit", "1", "--json", "--config", config))

    shown = json.loads(relay("events", "show", ids[0], "--json", "--config", config))
    assert shown["id"] == ids[0] and shown["duplicates"] == 1
    assert shown["payload"]["requestId"] == inbound["requestId"]
    assert json.loads(shown["raw_body"]) == inbound
    assert inbound["requestId"] in relay("events", "show", ids[0], "--config", config)
    rows = cli_table(relay("events", "list", "--config", config), first="ID")
    assert {row["ID"]: row["KIND"] for row in rows} == {
        ids[0]: "sms.inbound",  # the third post was a duplicate of the first
        ids[1]: "sms.dlr",
    }
    assert {row["ID"]: row["DUPLICATES"] for row in rows} == {ids[0]: "1", ids[1]: "0"}
    assert {row["SOURCE"] for row in rows} == {"default"}

    [rejected] = json.loads(relay("rejected", "list", "--json", "--config", config))
    assert rejected["status"] == 400 and rejected["raw_body"] == "{broken"
    [shown_rejected] = cli_table(relay("rejected", "list", "--config", config), first="ID")
    assert shown_rejected["ID"] == rejected["id"] and shown_rejected["STATUS"] == "400"
    assert shown_rejected["PATH"] == "/hooks/numinfo/gnp" and shown_rejected["COUNT"] == "1"
    assert shown_rejected["REASON"] == rejected["reason"]


def test_a_payload_with_a_lone_surrogate_prints_as_its_escape(tmp_path: Path) -> None:
    """Valid JSON that is not UTF-8 (``"\\ud800"``) is accepted and stored: a real terminal's
    strict UTF-8 output would make `events show` fail on it."""
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    config = str(write_config(tmp_path, url))
    relay("db", "upgrade", "--config", config)
    body = json.dumps(factories.sms_inbound({"message": "a\ud800b"}))

    async def store() -> str:
        engine = create_engine(url)
        try:
            async with running_client(engine) as client:
                answer = await client.post(
                    f"/hooks/sms/inbound?token={TOKEN}",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                assert answer.status_code == 200, answer.text
                return str(answer.json()["id"])
        finally:
            await engine.dispose()

    event_id = asyncio.run(store())
    shown = subprocess.run(
        [sys.executable, "-m", "relay", "events", "show", event_id, "--config", config],
        capture_output=True,
        env=child_environment() | {"PYTHONIOENCODING": "utf-8"},
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr.decode(errors="replace")
    assert b'"a\\ud800b"' in shown.stdout


def test_show_unknown_event_is_a_clear_error(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, f"sqlite:///{tmp_path / 'relay.db'}"))
    relay("db", "upgrade", "--config", config)
    result = CliRunner().invoke(main, ["events", "show", "nope", "--config", config])
    assert result.exit_code == 1 and "no event nope" in result.output


def test_config_errors_are_clear_and_name_no_secret(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[sources.default]\nheader = { name = "X-Key" }\n[sources.open]\n')
    result = CliRunner().invoke(main, ["events", "list", "--config", str(config)])
    assert result.exit_code == 1
    assert "sources.default.header.value" in result.output
    assert "allow_anonymous" in result.output
    missing = CliRunner().invoke(main, ["events", "list", "--config", str(tmp_path / "none")])
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_environment_overrides_top_level_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, "sqlite:///from-file.db")
    monkeypatch.setenv("RELAY_DATABASE_URL", "sqlite:///from-env.db")
    monkeypatch.setenv("RELAY_MAX_BODY_BYTES", "4096")
    monkeypatch.setenv("RELAY_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.0.0/16")
    settings = load_settings(config)
    assert settings.database_url == "sqlite:///from-env.db"
    assert settings.max_body_bytes == 4096
    assert [str(n) for n in settings.trusted_proxies] == ["10.0.0.0/8", "192.168.0.0/16"]
    assert settings.sources["default"].token[0].get_secret_value() == TOKEN
    monkeypatch.setenv("RELAY_MAX_BODY_BYTES", "lots")
    with pytest.raises(SettingsError, match="max_body_bytes"):
        load_settings(config)


def test_reserved_source_names_are_refused(tmp_path: Path) -> None:
    from receivers import ReceiverConfig, SourceConfig

    with pytest.raises(ValueError, match="taken by a receiver path"):
        ReceiverConfig(sources={"sms": SourceConfig(token=TOKEN)})


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("sms", "taken by a receiver path"),
        ('"eu?west"', "is not a path segment"),
        ('".."', "is not a path segment"),
        ("s" * (SOURCE_NAME_LENGTH + 1), f"is longer than {SOURCE_NAME_LENGTH} characters"),
    ],
)
def test_serve_refuses_a_source_name_that_cannot_work(
    tmp_path: Path, name: str, reason: str
) -> None:
    config = tmp_path / "relay.toml"
    database = tmp_path / "relay.db"
    config.write_text(
        f'database_url = "sqlite:///{database}"\n[sources.{name}]\ntoken = "{TOKEN}"\n'
    )
    result = CliRunner().invoke(main, ["serve", "--config", str(config), "--port", "1"])
    assert result.exit_code == 1, result.output
    assert "invalid configuration" in result.output and reason in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not database.exists()  # refused before the database was opened


@pytest.mark.parametrize("what", ["destination", "policy"])
def test_destination_and_policy_names_must_fit_the_deliveries_columns(
    tmp_path: Path, what: str
) -> None:
    def config_naming(name: str) -> Path:
        table = (
            f'[destinations.{name}]\ntype = "http"\nurl = "http://127.0.0.1:9/"\n'
            if what == "destination"
            else f'[policies.{name}]\ntype = "delays"\ndelays = ["1s"]\n'
        )
        return write_config(tmp_path, "sqlite:///x.db", table)

    assert Delivery.__table__.c[what].type.length == NAME_LENGTH
    assert DestinationState.__table__.c.name.type.length == NAME_LENGTH
    settings = load_settings(config_naming("n" * NAME_LENGTH))
    assert "n" * NAME_LENGTH in (
        settings.destinations if what == "destination" else settings.policies
    )
    with pytest.raises(
        SettingsError, match=f"{what} name 'nnnn.*longer than {NAME_LENGTH} characters"
    ):
        load_settings(config_naming("n" * (NAME_LENGTH + 1)))


def test_a_source_name_as_wide_as_the_source_columns_is_accepted(tmp_path: Path) -> None:
    for table in (ReceivedEvent.__table__, RejectedBody.__table__):
        assert table.c.source.type.length == SOURCE_NAME_LENGTH
    name = "s" * SOURCE_NAME_LENGTH
    settings = load_settings(
        write_config(tmp_path, "sqlite:///x.db", f'[sources.{name}]\ntoken = "{TOKEN}"\n')
    )
    assert name in settings.sources


def test_generated_token_is_kept_across_restarts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"

    async def token_of_a_fresh_start() -> str:
        engine = create_engine(url)
        try:
            await migrate.upgrade(engine)
            return await generated_token(engine)
        finally:
            await engine.dispose()

    first = asyncio.run(token_of_a_fresh_start())
    assert len(first) >= 32
    assert asyncio.run(token_of_a_fresh_start()) == first


async def postgresql_answers() -> None:
    await (await asyncpg.connect(PG_ADMIN_DSN, timeout=5)).close()


@pytest.mark.parametrize("problem", ["refused", "unknown database"])
@pytest.mark.parametrize(
    "command",
    [
        ["db", "upgrade"],
        ["db", "current"],
        ["events", "list"],
        ["sources", "list"],
        ["sources", "forget-default", "--yes"],
    ],
)
def test_a_database_that_cannot_be_used_is_one_clear_line(
    tmp_path: Path, command: list[str], problem: str
) -> None:
    if problem == "refused":
        url = f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/relay"
        reason = "connection refused"
    else:
        try:
            asyncio.run(postgresql_answers())
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            service_missing("PostgreSQL", exc)
        known = make_url(PG_ADMIN_DSN)
        url = known.set(password="hunter2", database="relay_nope").render_as_string(False)
        reason = 'database "relay_nope" does not exist'
    config = str(write_config(tmp_path, url))
    result = CliRunner().invoke(main, [*command, "--config", config])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    [line] = result.output.splitlines()
    assert line.startswith("Error: cannot connect to the database at postgresql")
    assert reason in line and "hunter2" not in line


# --- finding the configuration, and a store that is not there ----------------------------------


def test_the_config_is_the_option_else_the_environment_else_relay_toml_here(
    tmp_path: Path,
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    assert config_path(None, {}, here) is None
    (here / "relay.toml").mkdir()  # not a file: not a config
    assert config_path(None, {}, here) is None
    (here / "relay.toml").rmdir()
    (here / "relay.toml").write_text("")
    assert config_path(None, {}, here) == here / "relay.toml"
    assert config_path(None, {"RELAY_CONFIG": ""}, here) == here / "relay.toml"
    assert config_path(None, {"RELAY_CONFIG": "/etc/r.toml"}, here) == Path("/etc/r.toml")
    assert config_path("given.toml", {"RELAY_CONFIG": "/etc/r.toml"}, here) == Path("given.toml")


@pytest.mark.parametrize(
    ("given", "told"),
    [
        (["--config", "r.toml", "destinations", "list"], "relay destinations list --config r.toml"),
        (["--config=r.toml", "deliveries", "show", "x"], "relay deliveries show --config r.toml"),
        (["--config", "my r.toml", "db", "upgrade"], "relay db upgrade --config 'my r.toml'"),
        (["--config", "r.toml"], "relay COMMAND --config r.toml"),
        (["--config"], "relay COMMAND --config FILE"),
        (["--config=", "events", "list"], "relay events list --config FILE"),
        (["--config", "a", "--config", "b", "events"], "relay events --config b"),
        (["--config", "\x1b[2J", "events", "list"], "relay events list --config '\\x1b[2J'"),
        (["--config", "f" * 5000, "events", "list"], f"relay events list --config {'f' * 60}..."),
        (["--config", "r.toml", "nope", "list"], "relay COMMAND --config r.toml"),
    ],
    ids=[
        "before",
        "equals",
        "spaces",
        "no-command",
        "no-file",
        "empty",
        "twice",
        "escape",
        "huge",
        "unknown-command",
    ],
)
def test_config_before_the_command_is_an_error_that_says_where_it_goes(
    given: list[str], told: str
) -> None:
    result = CliRunner().invoke(main, given)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == f"Error: --config goes after the command: {told}"
    assert "\x1b" not in result.output


def test_another_unknown_option_before_the_command_keeps_clicks_error() -> None:
    result = CliRunner().invoke(main, ["--conf", "r.toml", "events", "list"])
    assert result.exit_code == 2 and "No such option '--conf'" in result.output


def test_commands_read_relay_toml_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'found.db'}"
    write_config(tmp_path, url)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RELAY_CONFIG", raising=False)
    assert migrate.head_revision() in relay("db", "upgrade")
    ids, _ = asyncio.run(store_some(url))
    assert {event["id"] for event in json.loads(relay("events", "list", "--json"))} == set(ids)


@pytest.mark.parametrize(
    "command",
    [
        ["events", "list"],
        ["events", "show", "x"],
        ["rejected", "list"],
        ["deliveries", "list"],
        ["destinations", "list"],
        ["db", "current"],
    ],
)
def test_reading_a_store_that_does_not_exist_is_one_line_and_creates_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    database = tmp_path / "never.db"
    config = str(write_config(tmp_path, f"sqlite:///{database}"))
    result = CliRunner().invoke(main, [*command, "--config", config])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        f"Error: there is no database at {database}: `relay serve` or `relay db upgrade` creates it"
    ]
    assert not database.exists()


@pytest.mark.parametrize("command", [["events", "list"], ["deliveries", "list"]])
def test_reading_a_store_that_is_not_migrated_is_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    database = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute("CREATE TABLE unrelated (x)")
    config = str(write_config(tmp_path, f"sqlite:///{database}"))
    result = CliRunner().invoke(main, [*command, "--config", config])
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    assert line.startswith("Error: the database schema is at revision none")
    assert "relay db upgrade" in line
    current = CliRunner().invoke(main, ["db", "current", "--config", config])
    assert current.exit_code == 0 and current.output.startswith("database: empty")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot be read"),  # a directory
        (b"\xff\xfe[sources]", "is not UTF-8 text"),
        (b"database_url = ", "is not valid TOML"),
        (b"x" * 1_000_000, "is not valid TOML"),
    ],
)
def test_an_unreadable_config_file_is_one_line(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    config = tmp_path / "relay.toml"
    if content is None:
        config.mkdir()
    else:
        config.write_bytes(content)
    result = CliRunner().invoke(main, ["events", "list"], env={"RELAY_CONFIG": str(config)})
    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert message in line and line.startswith(f"Error: config file {config}")


@pytest.mark.parametrize("what", ["destination", "policy", "source"])
@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ('""', "cannot be empty"),
        ('"  "', "cannot be empty or blank"),
        ('"tab\\there"', "control"),
        ('"nul\\u0000"', "control"),
        ('"crm\\u202egpj.exe"', "format"),  # a right-to-left override spoofs lists and logs
        ('"two\\u2028lines"', "control"),
    ],
)
def test_a_name_the_store_cannot_hold_is_refused(
    tmp_path: Path, what: str, key: str, shown: str
) -> None:
    table = {
        "destination": f'[destinations.{key}]\ntype = "http"\nurl = "http://127.0.0.1:9/"\n',
        "policy": f'[policies.{key}]\ntype = "delays"\ndelays = ["1s"]\n',
        "source": f'[sources.{key}]\ntoken = "{TOKEN}"\n',
    }[what]
    with pytest.raises(SettingsError, match=f"{what} name .*{shown}"):
        load_settings(write_config(tmp_path, "sqlite:///x.db", table))


def test_a_destination_name_with_an_unpaired_surrogate_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the environment's JSON can spell one (TOML cannot): events routed to it could never
    be stored, and every event would stay unrouted."""
    monkeypatch.setenv(
        "RELAY_DESTINATIONS", '{"bad\\ud800": {"type": "http", "url": "http://127.0.0.1:9/"}}'
    )
    with pytest.raises(SettingsError, match=r"destination name 'bad\\ud800' holds"):
        load_settings(write_config(tmp_path, "sqlite:///x.db"))


@pytest.mark.parametrize(
    ("table", "shown"),
    [
        ('sources = ["default", "tab\\there"]', "source name 'tab\\there' holds"),
        (
            'type = "arq"\nfunction = "f"\njob_id_prefix = "a\\u202eb"',
            "job_id_prefix 'a\\u202eb'",
        ),
    ],
)
def test_destination_values_that_name_things_refuse_what_names_refuse(
    tmp_path: Path, table: str, shown: str
) -> None:
    kind = "" if "type" in table else 'type = "http"\n'
    url = "redis://127.0.0.1:6379/0" if "arq" in table else "http://127.0.0.1:9/"
    config = write_config(
        tmp_path, "sqlite:///x.db", f'[destinations.d]\n{kind}url = "{url}"\n{table}\n'
    )
    with pytest.raises(SettingsError, match=re.escape(shown)):
        load_settings(config)
