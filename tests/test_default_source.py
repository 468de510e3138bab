"""The default source's generated token: the URLs printed for the platform at the first start keep
working when other sources are configured, until `[sources.default]` replaces them or
`relay sources forget-default` deletes the token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from receivers.kinds import kinds_by_path
from receivers.store.engine import create_engine
from relay.cli import main
from relay.server.bootstrap import DEFAULT_TOKEN_KEY, SETTINGS, generated_token, kept_token
from relay.server.default_source import TokenUse, served_sources
from relay.server.runtime import start
from relay.server.serve import print_generated_token
from relay.settings import Settings, SettingsError
from relay.simulator import factories
from relay.store import migrate
from tests.cli_support import table as cli_table
from tests.conftest import TOKEN, create_postgres_database, drop_postgres_database, running_client
from tests.console_support import ConsoleClient
from tests.store_support import blocking_eventually, child_environment, stored_events
from tests.support import free_port, stop_process

SIGNATURE_SECRET = "a-chat-signature-secret-0123456789"
CHAT = {"signature_secret": SIGNATURE_SECRET}
CHAT_ONLY = f'[sources.chat]\nsignature_secret = "{SIGNATURE_SECRET}"\n'
OWN_TOKEN = "our-own-default-token-0123456789"
CONSOLE_USER, CONSOLE_PASSWORD = "alice", "correct horse battery staple"

BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "/sms/inbound": factories.sms_inbound,
    "/sms/dlr": factories.sms_dlr,
    "/numinfo/gnp": factories.numinfo_gnp,
    "/numinfo/gnv": factories.numinfo_gnv,
    "/conversations": factories.conversations_status,
    "/chat-api": lambda: factories.conversations_status(v2=True),
    "/tts/events": factories.tts_event,
}
"""A valid callback for every receiver path (a new path fails here until it gets one)."""


# --- which sources `relay serve` serves, for every configuration -------------------------------

CONFIGURATIONS = {
    "nothing": {},
    "chat": {"chat": CHAT},
    "chat and eu": {"chat": CHAT, "eu": {"token": TOKEN}},
    "default": {"default": {"token": OWN_TOKEN}},
    "default and chat": {"default": {"token": OWN_TOKEN}, "chat": CHAT},
}


@pytest.mark.parametrize("configured", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
async def test_a_kept_generated_token_serves_the_default_source_until_it_is_configured(
    engine: AsyncEngine, database_url: str, configured: dict[str, Any]
) -> None:
    kept = await generated_token(engine)  # as a first start without any source left it
    runtime = await start(Settings(database_url=database_url, sources=configured))
    try:
        async with running_client(runtime.engine, dict(runtime.receiver_config.sources)) as client:
            answers = {
                path: (await client.post(f"/hooks{path}?token={kept}", json=body())).status_code
                for path, body in BODIES.items()
            }
        assert await kept_token(runtime.engine) == kept  # never replaced nor deleted by a start
    finally:
        await runtime.engine.dispose()
    configured_default = "default" in configured
    assert answers == dict.fromkeys(BODIES, 401 if configured_default else 200)
    assert set(runtime.receiver_config.sources) == {*configured, "default"}
    assert runtime.generated is not None and runtime.generated.token == kept
    assert runtime.generated.served is not configured_default


async def test_a_restart_says_it_reuses_the_token_instead_of_generating_one(
    engine: AsyncEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    first = (await served_sources({}, engine)).generated
    again = (await served_sources({}, engine)).generated
    assert first is not None and first.new and first.use is TokenUse.ALONE
    assert again is not None and not again.new and again.token == first.token

    print_generated_token(first, [], "127.0.0.1", 8000)
    said_first = capsys.readouterr().out
    print_generated_token(again, [], "127.0.0.1", 8000)
    said_again = capsys.readouterr().out
    assert "generated a token for the default source" in said_first
    assert "generated a token" not in said_again
    assert "keeps the token generated at an earlier start (the same URLs as before)" in said_again
    for said in (said_first, said_again):  # where the token was printed: its URLs, and only there
        assert said.count(first.token) == len(kinds_by_path())


@pytest.mark.parametrize(
    "configured", [c for c in CONFIGURATIONS.values() if c], ids=[k for k in CONFIGURATIONS][1:]
)
async def test_configured_sources_never_generate_a_token(
    engine: AsyncEngine, database_url: str, configured: dict[str, Any]
) -> None:
    runtime = await start(Settings(database_url=database_url, sources=configured))
    try:
        assert await kept_token(runtime.engine) is None
    finally:
        await runtime.engine.dispose()
    assert dict(runtime.receiver_config.sources).keys() == configured.keys()
    assert runtime.generated is None


async def test_the_console_filters_by_the_default_source_its_generated_token_serves(
    engine: AsyncEngine, database_url: str
) -> None:
    kept = await generated_token(engine)
    settings = Settings(
        database_url=database_url,
        sources={"chat": CHAT},
        console={"users": {CONSOLE_USER: CONSOLE_PASSWORD}},
    )
    runtime = await start(settings)
    app = runtime.app()
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://relay.test") as http,
        ):
            stored = await http.post(
                f"/hooks/sms/inbound?token={kept}", json=BODIES["/sms/inbound"]()
            )
            assert stored.status_code == 200
            console = ConsoleClient(http)
            assert (await console.login(CONSOLE_USER, CONSOLE_PASSWORD)).status_code == 303
            page = await http.get("/console/events", params={"source": "default"})
    finally:
        await runtime.engine.dispose()
    assert page.status_code == 200
    assert stored.json()["id"] in page.text


async def test_a_kept_value_that_is_no_usable_token_is_one_clear_refusal(
    engine: AsyncEngine, database_url: str
) -> None:
    await generated_token(engine)
    async with engine.begin() as conn:
        await conn.execute(
            update(SETTINGS).where(SETTINGS.c.key == DEFAULT_TOKEN_KEY).values(value="xyz")
        )
    with pytest.raises(SettingsError) as refused:
        await start(Settings(database_url=database_url, sources={"chat": CHAT}))
    assert "generated token kept in the database is unusable" in str(refused.value)
    assert "forget-default" in str(refused.value) and "xyz" not in str(refused.value)


# --- `relay serve` as the operator runs it: first start, a source added, the token retired -----

URL_LINE = re.compile(r"^  \S+\s+(http://\S+)$", re.MULTILINE)


@dataclass
class Started:
    """A `relay serve` process the test started, and what it printed on standard output."""

    process: subprocess.Popen[bytes]
    port: int
    output: Path

    def printed(self) -> str:
        return self.output.read_text()

    def printed_urls(self) -> list[str]:
        return URL_LINE.findall(self.printed())


def answers(process: subprocess.Popen[bytes], port: int, errors: Path) -> bool:
    """Whether the server is ready (a server that exited fails the test with its output)."""
    if process.poll() is not None:
        raise AssertionError(f"relay serve exited: {errors.read_text()}")
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def relay_serve(workdir: Path, environment: dict[str, str], name: str) -> Iterator[Started]:
    """`relay serve` in ``workdir`` (it reads ./relay.toml when there is one), until the block
    ends; ready when it is given."""
    port = free_port()
    output, errors = workdir / f"{name}.out", workdir / f"{name}.err"
    with output.open("wb") as stdout, errors.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "relay", "serve", "--port", str(port), "--log-level", "warning"],
            cwd=workdir,
            env=environment,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        blocking_eventually(lambda: answers(process, port, errors), timeout=60)
        yield Started(process, port, output)
    finally:
        stop_process(process)


def relay_command(workdir: Path, environment: dict[str, str], *args: str) -> str:
    """Run a `relay` command in ``workdir`` with the server's database, as an operator would
    (in this process: quicker than a new interpreter); its output (status 0)."""
    with contextlib.chdir(workdir):
        result = CliRunner().invoke(
            main,
            list(args),
            env={
                "RELAY_CONFIG": None,
                "RELAY_DATABASE_URL": environment["RELAY_DATABASE_URL"],
            },
            catch_exceptions=False,
        )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def own_database(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database of this test's own, not yet migrated: a SQLite file or a PostgreSQL database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'relay.db'}"
        return
    name, url = asyncio.run(create_postgres_database("relay_default_source"))
    try:
        yield url
    finally:
        asyncio.run(drop_postgres_database(name))


@pytest.fixture
def operator(tmp_path: Path, own_database: str) -> tuple[Path, dict[str, str]]:
    """A working directory without relay.toml and an environment naming only the database."""
    workdir = tmp_path / "relay"
    workdir.mkdir()
    environment = {k: v for k, v in child_environment().items() if not k.startswith("RELAY_")}
    environment["RELAY_DATABASE_URL"] = own_database
    relay_command(workdir, environment, "db", "upgrade")
    return workdir, environment


def first_start(workdir: Path, environment: dict[str, str]) -> list[str]:
    """The URLs the first start without configuration prints for the platform."""
    with relay_serve(workdir, environment, "first") as first:
        urls = first.printed_urls()
        assert "No sources configured: generated a token for the default source" in (
            first.printed()
        )
    assert [httpx.URL(url).path for url in urls] == [f"/hooks{path}" for path in kinds_by_path()]
    assert len({httpx.URL(url).params["token"] for url in urls}) == 1
    return urls


def post_each(urls: list[str], port: int) -> dict[str, int]:
    """POST a valid callback to each URL (on this port): the answers' status codes."""
    answers = {}
    for url in urls:
        printed = httpx.URL(url)
        path = printed.path.removeprefix("/hooks")
        answer = httpx.post(printed.copy_with(port=port), json=BODIES[path](), timeout=10)
        answers[path] = answer.status_code
    return answers


@pytest.mark.slow
def test_adding_a_source_keeps_the_printed_urls_until_forget_default(
    operator: tuple[Path, dict[str, str]], own_database: str
) -> None:
    workdir, environment = operator
    urls = first_start(workdir, environment)
    (workdir / "relay.toml").write_text(CHAT_ONLY)

    with relay_serve(workdir, environment, "with-chat") as server:
        assert [httpx.URL(url).copy_with(port=None) for url in server.printed_urls()] == [
            httpx.URL(url).copy_with(port=None) for url in urls
        ]
        assert post_each(urls, server.port) == dict.fromkeys(BODIES, 200)
        said = " ".join(server.printed().split())
        assert "Sources configured: chat; [sources.default] is not." in said
        assert "still served with the token generated at an earlier start" in said
        assert "because the platform may still call its URLs" in said
        assert "configure [sources.default] or run `relay sources forget-default`" in said
    assert {event["source"] for event in events_of(own_database)} == {"default"}
    assert len(events_of(own_database)) == len(BODIES)

    listed = relay_command(workdir, environment, "sources", "list")
    assert "token (generated, kept in the database)" in listed and "chat" in listed
    token = httpx.URL(urls[0]).params["token"]
    assert token not in listed
    forgot = relay_command(workdir, environment, "sources", "forget-default", "--yes")
    assert "Forgot the default source's generated token" in forgot and "404" in forgot

    with relay_serve(workdir, environment, "forgotten") as server:
        assert server.printed_urls() == [] and token not in server.printed()
        assert post_each(urls, server.port) == dict.fromkeys(BODIES, 404)
    again = relay_command(workdir, environment, "sources", "forget-default", "--yes")
    assert again.startswith("Nothing to forget")


@pytest.mark.slow
def test_a_configured_default_source_retires_the_generated_token(
    operator: tuple[Path, dict[str, str]],
) -> None:
    workdir, environment = operator
    urls = first_start(workdir, environment)
    token = httpx.URL(urls[0]).params["token"]
    (workdir / "relay.toml").write_text(f'[sources.default]\ntoken = "{OWN_TOKEN}"\n' + CHAT_ONLY)

    with relay_serve(workdir, environment, "configured") as server:
        said = " ".join(server.printed().split())
        assert said.count("generated token is retired") == 1
        assert "`relay sources forget-default` deletes it" in said
        assert token not in said and server.printed_urls() == []
        assert post_each(urls, server.port) == dict.fromkeys(BODIES, 401)
        own = [str(httpx.URL(url).copy_merge_params({"token": OWN_TOKEN})) for url in urls]
        assert post_each(own, server.port) == dict.fromkeys(BODIES, 200)

    assert "generated token is kept in the database but retired" in relay_command(
        workdir, environment, "sources", "list"
    )
    forgot = relay_command(workdir, environment, "sources", "forget-default", "--yes")
    assert "nothing changes for callers" in forgot


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgresql"])
def test_every_replica_serves_the_same_kept_token(
    operator: tuple[Path, dict[str, str]], backend: str
) -> None:
    workdir, environment = operator
    with (
        relay_serve(workdir, environment, "first-a") as first,
        relay_serve(workdir, environment, "first-b") as second,
    ):
        assert first.printed_urls() and [
            httpx.URL(url).copy_with(port=None) for url in first.printed_urls()
        ] == [httpx.URL(url).copy_with(port=None) for url in second.printed_urls()]
    urls = first.printed_urls()
    (workdir / "relay.toml").write_text(CHAT_ONLY)
    with (
        relay_serve(workdir, environment, "chat-a") as first,
        relay_serve(workdir, environment, "chat-b") as second,
    ):
        assert post_each(urls, first.port) == dict.fromkeys(BODIES, 200)
        assert post_each(urls, second.port) == dict.fromkeys(BODIES, 200)  # duplicates: 200 too
        assert "relay sources forget-default" in second.printed()


def events_of(database_url: str) -> list[dict[str, Any]]:
    """Every stored event of the database."""

    async def read() -> list[dict[str, Any]]:
        engine = create_engine(database_url)
        try:
            return list((await stored_events(engine)).values())
        finally:
            await engine.dispose()

    return asyncio.run(read())


# --- `relay sources`: hostile and empty input ---------------------------------------------------


def kept_in(database_url: str, *, generate: bool = False) -> str | None:
    """The token the database keeps (migrated first; ``generate``: as a first start would)."""

    async def read() -> str | None:
        engine = create_engine(database_url)
        try:
            await migrate.upgrade(engine)
            return await (generated_token(engine) if generate else kept_token(engine))
        finally:
            await engine.dispose()

    return asyncio.run(read())


def configured(tmp_path: Path, database_url: str, sources: str = "") -> str:
    """A config file naming the database and these ``[sources.*]`` tables: its path."""
    config = tmp_path / "relay.toml"
    config.write_text(f'database_url = "{database_url}"\n{sources}')
    return str(config)


def invoke(*args: str, answer: str | bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=answer)


ABORTED = "Aborted!"
ANSWERS = {
    "eof": (None, ABORTED),
    "empty": ("", ABORTED),
    "enter": ("\n", ABORTED),
    "n": ("n\n", ABORTED),
    "no": ("no\n", ABORTED),
    "N": ("N\n", ABORTED),
    "maybe": ("maybe\n", ABORTED),  # asked again, then no more input
    "huge": ("y" * 100_000 + "\n", ABORTED),
    "not-utf8": (b"\xff\xfe\n", "Error: the answer is not readable text: nothing was changed"),
}


@pytest.mark.parametrize(("answer", "said"), ANSWERS.values(), ids=ANSWERS.keys())
def test_forget_default_asks_first_and_anything_but_yes_keeps_the_token(
    tmp_path: Path, own_database: str, answer: str | bytes | None, said: str
) -> None:
    token = kept_in(own_database, generate=True)
    config = configured(tmp_path, own_database, CHAT_ONLY)
    result = invoke("sources", "forget-default", "--config", config, answer=answer)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert said in result.output.splitlines()
    assert "Forget it? [y/N]" in result.output and "404" in result.output
    assert token is not None and token not in result.output
    assert kept_in(own_database) == token


def test_forget_default_deletes_the_token_on_yes(tmp_path: Path, own_database: str) -> None:
    token = kept_in(own_database, generate=True)
    config = configured(tmp_path, own_database, CHAT_ONLY)
    result = invoke("sources", "forget-default", "--config", config, answer="y\n")
    assert result.exit_code == 0, result.output
    assert "Forgot the default source's generated token" in result.output
    assert token is not None and token not in result.output
    assert kept_in(own_database) is None
    again = invoke("sources", "forget-default", "--config", config)  # nothing asked
    assert again.exit_code == 0 and again.output.startswith("Nothing to forget:"), again.output


@pytest.mark.parametrize(
    ("sources", "outcome"),
    [
        ("", "the next `relay serve` generates a new token"),
        (CHAT_ONLY, "its URLs (/hooks/...) answer 404"),
        (f'[sources.default]\ntoken = "{OWN_TOKEN}"\n', "nothing changes for callers"),
    ],
    ids=["nothing configured", "chat", "default"],
)
def test_forget_default_says_what_forgetting_changes_for_the_platform(
    tmp_path: Path, own_database: str, sources: str, outcome: str
) -> None:
    kept_in(own_database, generate=True)
    config = configured(tmp_path, own_database, sources)
    result = invoke("sources", "forget-default", "--yes", "--config", config)
    assert result.exit_code == 0, result.output
    assert outcome in " ".join(result.output.split())
    if not sources:
        assert "answer 401" in result.output


def test_nothing_kept_is_said_plainly_and_changes_nothing(
    tmp_path: Path, own_database: str
) -> None:
    assert kept_in(own_database) is None
    config = configured(tmp_path, own_database, CHAT_ONLY)
    result = invoke("sources", "forget-default", "--config", config)
    assert result.exit_code == 0
    assert result.output.startswith("Nothing to forget: the database at ")
    assert "keeps no generated token" in result.output
    listed = invoke("sources", "list", "--json", "--config", config)
    assert [row["name"] for row in json.loads(listed.output)] == ["chat"]


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["forget-default", "extra"], "unexpected extra argument"),
        (["forget-default", "--yes=1"], "does not take a value"),
        (["forget-default", "--yes", "--yes", "--force"], "No such option '--force'"),
        (["forget"], "No such command 'forget'"),
        (["list", "extra"], "unexpected extra argument"),
        (["list", "--json=yes"], "does not take a value"),
        (["list", "--config"], "requires an argument"),
        (["forget-default", "--config", "."], "is a directory"),
        ([], "Usage:"),
    ],
)
def test_sources_commands_refuse_bad_arguments_and_keep_the_token(
    tmp_path: Path, args: list[str], complaint: str
) -> None:
    database_url = f"sqlite:///{tmp_path / 'relay.db'}"
    token = kept_in(database_url, generate=True)
    result = invoke("sources", *args, answer="y\n")
    assert result.exit_code == 2 and complaint in result.output, result.output
    assert kept_in(database_url) == token


@pytest.mark.parametrize("command", [["list"], ["forget-default", "--yes"]])
def test_sources_commands_create_no_database_and_name_a_missing_config(
    tmp_path: Path, command: list[str]
) -> None:
    database = tmp_path / "none.db"
    result = invoke("sources", *command, "--config", configured(tmp_path, f"sqlite:///{database}"))
    assert result.exit_code == 1
    assert result.output == (
        f"Error: there is no database at {database}: `relay serve` or `relay db upgrade` "
        "creates it\n"
    )
    assert not database.exists()
    missing = invoke("sources", *command, "--config", str(tmp_path / "missing.toml"))
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_sources_list_names_every_check_and_never_a_secret(
    tmp_path: Path, own_database: str
) -> None:
    secrets = {
        "token": ["first-token-0123456789", "second-token-0123456789"],
        "basic": "platform:basic-password-0123456789",
        "header": "header-value-0123456789",
        "signature": SIGNATURE_SECRET,
    }
    generated = kept_in(own_database, generate=True)
    config = configured(
        tmp_path,
        own_database,
        f"[sources.eu]\ntoken = {json.dumps(secrets['token'])}\n"
        f'basic_auth = "{secrets["basic"]}"\n'
        f'header = {{ name = "X-Callback-Key", value = "{secrets["header"]}" }}\n'
        'allow_ips = ["203.0.113.0/24"]\n'
        f'[sources.chat]\nsignature_secret = "{secrets["signature"]}"\n'
        'signature_method = "HS512"\n'
        "[sources.open]\nallow_anonymous = true\n",
    )
    table = invoke("sources", "list", "--config", config)
    as_json = invoke("sources", "list", "--json", "--config", config)
    assert table.exit_code == 0 and as_json.exit_code == 0, table.output + as_json.output
    rows = {row["name"]: row for row in json.loads(as_json.output)}
    assert list(rows) == ["default", "eu", "chat", "open"]
    assert rows["default"]["checks"] == ["token (generated, kept in the database)"]
    assert rows["default"]["generated_token"] == "beside-configured"
    assert rows["eu"]["checks"] == [
        "allow_ips 203.0.113.0/24",
        "token (any of 2)",
        "basic_auth",
        "header X-Callback-Key",
    ]
    assert rows["chat"]["checks"] == ["signature_secret HS512, 300 s"]
    assert rows["open"]["checks"] == ["none (allow_anonymous)"]
    assert rows["eu"]["paths"] == [f"/hooks/eu{path}" for path in kinds_by_path()]
    for output in (table.output, as_json.output):
        assert generated is not None and generated not in output
        for secret in [*secrets["token"], secrets["basic"], secrets["header"], SIGNATURE_SECRET]:
            assert secret not in output and secret.split(":")[-1] not in output
    shown = {row["SOURCE"]: row for row in cli_table(table.output, first="SOURCE")}
    assert list(shown) == ["default", "eu", "chat", "open"]
    assert shown["eu"]["PREFIX"] == "/hooks/eu" and shown["default"]["PREFIX"] == "/hooks"
    assert shown["eu"]["CHECKS"] == "; ".join(rows["eu"]["checks"])
    assert shown["open"]["CHECKS"] == "none (allow_anonymous)"
    assert "forget-default" in table.output


async def test_listing_the_generated_token_in_sources_default_moves_to_a_new_one_smoothly(
    engine: AsyncEngine, database_url: str
) -> None:
    kept = await generated_token(engine)
    own = {"default": {"token": [kept, OWN_TOKEN]}}  # both, until the platform uses the new one
    runtime = await start(Settings(database_url=database_url, sources=own))
    try:
        async with running_client(runtime.engine, dict(runtime.receiver_config.sources)) as client:
            answers = [
                (await client.post(f"/hooks/sms/inbound?token={token}", json=body)).status_code
                for token, body in [
                    (kept, factories.sms_inbound()),
                    (OWN_TOKEN, factories.sms_inbound()),
                ]
            ]
    finally:
        await runtime.engine.dispose()
    assert answers == [200, 200]


LISTED_STATES = {
    "nothing yet": ("", False, [], "no token is generated yet"),
    "generated alone": ("", True, [("default", "alone")], "token (generated, kept"),
    "beside chat": (
        CHAT_ONLY,
        True,
        [("default", "beside-configured"), ("chat", None)],
        "served with its generated token because [sources.default] is not configured",
    ),
    "retired": (
        f'[sources.default]\ntoken = "{OWN_TOKEN}"\n',
        True,
        [("default", "retired")],
        "kept in the database but retired",
    ),
}


@pytest.mark.parametrize(
    ("sources", "kept", "rows", "said"), LISTED_STATES.values(), ids=list(LISTED_STATES)
)
def test_sources_list_tells_each_state_of_the_generated_token(
    tmp_path: Path,
    own_database: str,
    sources: str,
    kept: bool,
    rows: list[tuple[str, str | None]],
    said: str,
) -> None:
    kept_in(own_database, generate=kept)
    config = configured(tmp_path, own_database, sources)
    listed = invoke("sources", "list", "--json", "--config", config)
    table = invoke("sources", "list", "--config", config)
    assert listed.exit_code == 0 and table.exit_code == 0, listed.output + table.output
    assert [(row["name"], row["generated_token"]) for row in json.loads(listed.output)] == rows
    assert said in table.output
    assert (kept_in(own_database) is not None) is kept  # listing never generates a token
