"""What the commands print: tables whose columns line up and whose cells cannot drive a
terminal, `events list --kind` globs, `rejected show` of hostile bodies, counted nouns."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.kinds import KINDS_BY_NAME
from receivers.store import queries
from receivers.store.engine import create_engine
from relay.cli import main
from relay.commands.escape import KEPT, escaped
from relay.commands.tables import table_lines
from relay.simulator import factories
from relay.store import migrate
from relay.words import counted
from tests.cli_support import header_starts, table
from tests.conftest import TOKEN, running_client

TERMINAL_DRIVERS = ("\x1b", "\x00", "\x07", "\x9b", "\r", "\u202e", "\x7f", "\u2028")
"""Characters that, printed raw, move the cursor, clear or retitle, or reorder what follows."""
HUGE = 512 * 1024


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def write_config(tmp_path: Path, database_url: str) -> str:
    config = tmp_path / "relay.toml"
    config.write_text(f'database_url = "{database_url}"\n[sources.default]\ntoken = "{TOKEN}"\n')
    return str(config)


# --- tables -------------------------------------------------------------------------------


ROWS = [
    ["019a-1", "crm", 3, None, "HTTP 503"],
    ["019a-22", "a much longer name", 12, "2026-01-01 00:00:00", ""],
    ["0", "[bold]markup[/bold] :smile:", 0, "x", "two\nlines\tand \x1b[2J"],
]
HEADERS = ["ID", "DESTINATION", "ATTEMPTS", "NEXT ATTEMPT (UTC)", "LAST"]


def test_every_cell_starts_at_its_header_s_column_whatever_the_widths() -> None:
    text = "\n".join(table_lines(HEADERS, ROWS, terminal=False, width=80))
    rows = table(text, first="ID")
    assert [row["DESTINATION"] for row in rows] == [
        "crm",
        "a much longer name",
        "[bold]markup[/bold] :smile:",  # text, never rich's markup
    ]
    assert [row["NEXT ATTEMPT (UTC)"] for row in rows] == ["-", "2026-01-01 00:00:00", "x"]
    assert rows[1]["LAST"] == "-"  # an empty cell shows a dash: no column starts blank
    assert rows[2]["LAST"] == "two\\x0alines\\x09and \\x1b[2J"


def test_off_a_terminal_a_table_has_no_colour_no_box_no_wrap_and_no_trailing_space() -> None:
    long = "x" * 500
    lines = table_lines(["A", "B"], [[long, "y"]], terminal=False, width=40)
    assert lines == [f"{'A':<500}  B", f"{long}  y"]
    assert not any(char in "\n".join(lines) for char in "\x1b─│┃━")


def test_on_a_terminal_the_header_is_bold_and_long_cells_wrap_in_its_width() -> None:
    lines = table_lines(["A", "B"], [["x" * 100, "y"]], terminal=True, width=40)
    assert "\x1b[1m" in lines[0]
    visible = [line.replace("\x1b[1m", "").replace("\x1b[0m", "") for line in lines]
    assert all(len(line) <= 40 for line in visible) and len(lines) > 2


def test_a_cell_that_drives_a_terminal_is_escaped() -> None:
    [_, line] = table_lines(["X"], [["".join(TERMINAL_DRIVERS)]], terminal=False, width=80)
    assert not any(char in line for char in TERMINAL_DRIVERS)
    assert line == "\\x1b\\x00\\x07\\x9b\\x0d\\u202e\\x7f\\u2028"


def test_header_starts_are_found_across_single_spaces_in_headers() -> None:
    assert header_starts("ID  NEXT ATTEMPT (UTC)  LAST") == [0, 4, 24]


@pytest.mark.parametrize(
    ("count", "one", "many", "said"),
    [
        (0, "attempt", None, "0 attempts"),
        (1, "attempt", None, "1 attempt"),
        (2, "attempt", None, "2 attempts"),
        (1, "delivery", None, "1 delivery"),
        (5, "delivery", None, "5 deliveries"),
        (2, "held delivery", "held deliveries", "2 held deliveries"),
        (1, "quarantined body", "quarantined bodies", "1 quarantined body"),
    ],
)
def test_counted_nouns_read_right(count: int, one: str, many: str | None, said: str) -> None:
    assert counted(count, one, many) == said


# --- events list --kind ---------------------------------------------------------------------


async def post(engine: AsyncEngine, posts: list[tuple[str, bytes]]) -> list[str]:
    """Post each body to its path with the token; the ids the receiver answered."""
    async with running_client(engine) as client:
        answers = [
            await client.post(
                f"{path}?token={TOKEN}", content=body, headers={"content-type": "application/json"}
            )
            for path, body in posts
        ]
    return [str(answer.json().get("id", "")) for answer in answers]


async def store(database_url: str, posts: list[tuple[str, bytes]]) -> list[str]:
    """:func:`post` into a new SQLite store."""
    engine = create_engine(database_url)
    try:
        await migrate.upgrade(engine)
        return await post(engine, posts)
    finally:
        await engine.dispose()


def stored_kinds(tmp_path: Path) -> tuple[str, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    posts = [
        ("/hooks/sms/inbound", json.dumps(factories.sms_inbound()).encode()),
        ("/hooks/sms/dlr", json.dumps(factories.sms_dlr()).encode()),
        ("/hooks/tts/events", json.dumps(factories.tts_event()).encode()),
    ]
    ids = asyncio.run(store(url, posts))
    kinds = ["sms.inbound", "sms.dlr", "tts.event"]
    return write_config(tmp_path, url), dict(zip(ids, kinds, strict=True))


@pytest.mark.parametrize(
    ("globs", "kinds"),
    [
        (["sms.*"], {"sms.inbound", "sms.dlr"}),
        (["sms.dlr"], {"sms.dlr"}),
        (["*"], {"sms.inbound", "sms.dlr", "tts.event"}),
        (["sms.d?r", "tts.*"], {"sms.dlr", "tts.event"}),
        (["sms.*", "sms.inbound"], {"sms.inbound", "sms.dlr"}),  # repeated: once each
        (["[st]*.*n*"], {"sms.inbound", "tts.event"}),
        (["numinfo.*"], set()),  # a known kind with no event
    ],
)
def test_events_list_takes_the_globs_destinations_take(
    tmp_path: Path, globs: list[str], kinds: set[str]
) -> None:
    config, kind_of = stored_kinds(tmp_path)
    options = [arg for glob in globs for arg in ("--kind", glob)]
    listed = cli("events", "list", *options, "--json", "--config", config)
    assert listed.exit_code == 0, listed.output
    assert {event["kind"] for event in json.loads(listed.output)} == kinds
    shown = cli("events", "list", *options, "--config", config)
    assert shown.exit_code == 0, shown.output
    if kinds:
        rows = table(shown.output, first="ID")
        assert {row["KIND"] for row in rows} == kinds
        assert all(kind_of[row["ID"]] == row["KIND"] for row in rows)


@pytest.mark.parametrize(
    ("glob", "said"),
    [
        ("", "'' matches no kind"),
        ("SMS.*", "'SMS.*' matches no kind"),  # letter case counts, as in destinations
        ("sms", "'sms' matches no kind"),
        ("nope.*", "'nope.*' matches no kind"),
        ("\x1b[2J*", "'\\\\x1b[2J*' matches no kind"),
        ("x" * 100_000, "'" + "x" * 60 + "...' matches no kind"),
    ],
)
def test_a_kind_glob_that_matches_no_kind_is_a_usage_error_naming_the_kinds(
    tmp_path: Path, glob: str, said: str
) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'relay.db'}")
    result = cli("events", "list", "--kind", glob, "--config", config)
    assert result.exit_code == 2
    assert said in result.output and ", ".join(KINDS_BY_NAME) in result.output
    assert "\x1b" not in result.output


def test_a_kind_option_without_its_value_is_a_usage_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'relay.db'}")
    result = cli("events", "list", "--config", config, "--kind")
    assert result.exit_code == 2 and "requires an argument" in result.output


# --- rejected show --------------------------------------------------------------------------


HOSTILE = {
    "ansi": b"\x1b[2J\x1b]0;owned\x07\x1b[31mred\x1b[0m",
    "nul": b"before\x00after",
    "invalid utf-8": b"\xff\xfe\xc3(",
    "c1 and bidi": "\u009b31m \u202etxt.exe".encode(),
    "carriage return": b"shown\rhidden",
    "huge": b"{" + b"\x1b" * HUGE,
    "empty": b"",
}


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_rejected_show_prints_a_hostile_body_escaped_and_its_json_exactly(
    tmp_path: Path, engine: AsyncEngine, database_url: str, name: str
) -> None:
    body = HOSTILE[name]
    await post(engine, [("/hooks/numinfo/gnp", body)])
    config = write_config(tmp_path, database_url)
    listed = await asyncio.to_thread(cli, "rejected", "list", "--config", config)
    assert listed.exit_code == 0, listed.output
    print(repr(listed.output), table, table(listed.output, first="ID"))
    [row] = table(listed.output, first="ID")
    assert row["PATH"] == "/hooks/numinfo/gnp" and row["STATUS"] == "400"

    shown = await asyncio.to_thread(cli, "rejected", "show", row["ID"], "--config", config)
    assert shown.exit_code == 0, shown.output
    head, _, printed = shown.output.partition("\nbody:\n")
    assert re.search(rf"^size: +{counted(len(body), 'byte')}$", head, re.MULTILINE)
    assert re.search(r"^path: +/hooks/numinfo/gnp$", head, re.MULTILINE)
    assert printed == escaped(body, keep=KEPT) + "\n"
    assert not any(char in shown.output for char in TERMINAL_DRIVERS)
    if name == "ansi":
        assert printed.startswith("\\x1b[2J\\x1b]0;owned\\x07")
    if name == "invalid utf-8":
        assert printed == "\\xff\\xfe\\xc3(\n"

    as_json = await asyncio.to_thread(
        cli, "rejected", "show", row["ID"].upper(), "--json", "--config", config
    )
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.output)
    assert document["id"] == row["ID"]
    if "raw_body" in document:
        assert document["raw_body"].encode() == body
    else:
        assert base64.b64decode(document["raw_body_base64"]) == body


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("01a1fdfa-4600-7389-ac37-7e5856d36cd2", "01a1fdfa-4600-7389-ac37-7e5856d36cd2"),
        ("nope", "nope"),
        ("", ""),
        ("01a1fdfa-4600-7389-ac37-7e5856d36cd\x00", "01a1fdfa-4600-7389-ac37-7e5856d36cd\\x00"),
        ("\x1b[2J", "\\x1b[2J"),
        ("9" * 100_000, "9" * 60 + "..."),
    ],
)
async def test_rejected_show_of_an_unknown_id_is_a_clear_error(
    tmp_path: Path, engine: AsyncEngine, database_url: str, given: str, said: str
) -> None:
    await post(engine, [("/hooks/numinfo/gnp", b"{")])  # one there, not this one
    config = write_config(tmp_path, database_url)
    result = await asyncio.to_thread(cli, "rejected", "show", given, "--config", config)
    assert result.exit_code == 1
    assert result.output == (
        f"Error: no quarantined body {said} (`relay rejected list` lists them)\n"
    )


def test_rejected_show_needs_an_id_and_takes_one(tmp_path: Path) -> None:
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'relay.db'}")
    missing = cli("rejected", "show", "--config", config)
    assert missing.exit_code == 2 and "Missing argument" in missing.output
    two = cli("rejected", "show", "a", "b", "--config", config)
    assert two.exit_code == 2


def test_rejected_show_of_a_store_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    database = tmp_path / "never.db"
    config = write_config(tmp_path, f"sqlite:///{database}")
    result = cli("rejected", "show", "nope", "--config", config)
    assert result.exit_code == 1 and result.output.startswith("Error: there is no database")
    assert not database.exists()


async def test_events_show_escapes_what_the_caller_sent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relay.db'}"
    inbound = factories.sms_inbound({"message": "hi \u202eexe.txt \u009b2J"})
    [event_id] = await store(url, [("/hooks/sms/inbound", json.dumps(inbound).encode())])
    config = write_config(tmp_path, url)
    shown = await asyncio.to_thread(cli, "events", "show", event_id, "--config", config)
    assert shown.exit_code == 0, shown.output
    assert "\u202e" not in shown.output and "\u009b" not in shown.output
    assert "hi \\u202eexe.txt \\x9b2J" in shown.output


async def test_events_of_several_kinds_are_the_newest_of_them_all_in_order(
    engine: AsyncEngine,
) -> None:
    """Each kind is read from its own index, then merged: the newest ``limit`` of them all."""
    posts = [
        ("/hooks/sms/inbound", json.dumps(factories.sms_inbound()).encode()),
        ("/hooks/sms/dlr", json.dumps(factories.sms_dlr()).encode()),
        ("/hooks/tts/events", json.dumps(factories.tts_event()).encode()),
        ("/hooks/sms/dlr", json.dumps(factories.sms_dlr()).encode()),
        ("/hooks/sms/inbound", json.dumps(factories.sms_inbound()).encode()),
    ]
    ids = await post(engine, posts)
    newest_sms = [ids[4], ids[3], ids[1], ids[0]]
    listed = await queries.list_events(engine, kind=["sms.inbound", "sms.dlr"], limit=3)
    assert [row.id for row in listed] == newest_sms[:3]
    listed = await queries.list_events(engine, kind=["sms.dlr", "sms.inbound", "sms.dlr"])
    assert [row.id for row in listed] == newest_sms
    assert await queries.list_events(engine, kind=[]) == []


@pytest.mark.parametrize(("command", "what"), [("events", "event"), ("deliveries", "delivery")])
@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("01a1fdfa-4600-7389-ac37-7e5856d36cd\x00", "01a1fdfa-4600-7389-ac37-7e5856d36cd\\x00"),
        ("\x1b[2J", "\\x1b[2J"),
        ("9" * 100_000, "9" * 60 + "..."),
        ("", ""),
    ],
)
async def test_show_of_a_hostile_id_is_a_clear_error(
    tmp_path: Path,
    engine: AsyncEngine,
    database_url: str,
    command: str,
    what: str,
    given: str,
    said: str,
) -> None:
    config = write_config(tmp_path, database_url)
    result = await asyncio.to_thread(cli, command, "show", given, "--config", config)
    assert result.exit_code == 1 and result.output == f"Error: no {what} {said}\n"
