"""No secret a user configures (nor one `relay serve` generates) is ever printed: `relay serve`
(embedded) and `relay serve` + `relay worker` (scaled, on PostgreSQL and Redis) run at
``--log-level debug`` in both log formats with a distinct random secret in every configurable
place, deliveries succeed and fail (500, connection refused, refused logins), and neither their
output nor that of the operators' commands, console pages and metrics holds any secret in any
of the forms it could take (as written, percent-encoded, JSON- or repr-escaped, base64 of a
basic-auth pair)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from receivers.auth import sign
from receivers.store import create_engine
from relay.dispatch.jobs import open_pool
from relay.settings import SettingsError, load_settings
from relay.simulator import factories
from relay.store import inspect
from tests.amqp_support import new_vhost, rabbitmqctl
from tests.conftest import create_postgres_database, drop_postgres_database, private_redis
from tests.console_support import LOGIN_TOKEN
from tests.mqtt_support import unique_root
from tests.nats_support import create_stream, delete_stream, shared_server
from tests.secrets_support import (
    Services,
    config_toml,
    leaks,
    postgres_url,
    random_secrets,
)
from tests.store_support import child_environment, eventually
from tests.support import Answer, Sink, free_port, serving, stop_process

RUN_SECONDS = 60.0
"""How long a run may take to reach every outcome it waits for."""
SUCCEEDING = ("crm", "stream", "queue", "rabbit", "jetstream", "jetstream_token", "mqtt")
FAILING = ("failing", "refused", "stream_denied", "rabbit_denied")
"""The destinations of :func:`tests.secrets_support.config_toml` that deliver, and those that
cannot (an answer of 500, a refused connection, a wrong password)."""


def relay_process(
    tmp_path: Path, name: str, *args: str, log_format: str
) -> subprocess.Popen[bytes]:
    """``relay *args`` at debug in ``log_format``, its standard output in ``name.out`` and its
    standard error (the log) in ``name.err``."""
    with (tmp_path / f"{name}.out").open("wb") as out, (tmp_path / f"{name}.err").open("wb") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relay",
                *args,
                "--log-level",
                "debug",
                "--log-format",
                log_format,
                "--config",
                str(tmp_path / "relay.toml"),
            ],
            stdout=out,
            stderr=err,
            cwd=tmp_path,
            env={k: v for k, v in child_environment().items() if not k.startswith("RELAY_")},
        )


async def relay_command(tmp_path: Path, *args: str) -> str:
    """What an operator's ``relay *args`` prints (both streams); the test's loop (its sink)
    keeps running meanwhile."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "relay",
        *args,
        "--config",
        str(tmp_path / "relay.toml"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={k: v for k, v in child_environment().items() if not k.startswith("RELAY_")},
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout=RUN_SECONDS)
    except TimeoutError:
        process.kill()
        raise AssertionError(f"relay {' '.join(args)} did not end within {RUN_SECONDS} s") from None
    return output.decode("utf-8", "replace")


async def started(base_url: str, process: subprocess.Popen[bytes], err: Path) -> None:
    """Wait until the server answers /readyz (failing at once if it exited)."""

    async def ready() -> bool:
        assert process.poll() is None, err.read_text(errors="replace")[-3000:]
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{base_url}/readyz", timeout=1)).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(ready, timeout=RUN_SECONDS)


async def send_callbacks(base_url: str, values: dict[str, str]) -> None:
    """Callbacks through every source's checks, refusals included (wrong and malformed
    credentials, a token in the path), and a console session: every path logs what it logs."""
    token = values["source_token"]
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        accepted = [
            await client.post(f"/hooks/sms/inbound?token={token}", json=factories.sms_inbound()),
            await client.get(f"/hooks/sms/dlr?token={token}&msgid=1&stat=DELIVRD"),
            await client.post(
                "/hooks/basic/sms/inbound",
                json=factories.sms_inbound(),
                auth=("ops", values["basic_auth_password"]),
            ),
        ]
        body = json.dumps(factories.conversations_status()).encode()
        stamp = str(int(time.time()))
        accepted.append(
            await client.post(
                "/hooks/chat/conversations",
                content=body,
                headers={
                    "content-type": "application/json",
                    "x-request-timestamp": stamp,
                    "x-signature": sign(values["signature_secret"], stamp, body),
                    "x-signature-version": "V1.0",
                    "X-Callback-Key": values["header_value"],
                },
            )
        )
        assert [answer.status_code for answer in accepted] == [200] * 4, [
            answer.text for answer in accepted
        ]
        refused = [
            await client.post(f"/hooks/sms/inbound?token%3D{token}", content=b"{}"),
            await client.post(f"/hooks/sms/inbound?tok%65n={token}x", content=b"{}"),
            await client.post(f"/hooks/sms/inbound/{token}", content=b"{}"),
            await client.post("/hooks/basic/sms/inbound", auth=("ops", values["header_value"])),
        ]
        assert all(answer.status_code in (401, 404, 405) for answer in refused)
        await console_pages(client, values)


async def console_pages(client: httpx.AsyncClient, values: dict[str, str]) -> None:
    """Log in to the console (and fail once) and read its pages: none shows a secret."""
    for password in (values["basic_auth_password"], values["console_password"]):
        form = await client.get("/console/login")
        token = LOGIN_TOKEN.search(form.text)
        assert token is not None, form.text
        await client.post(
            "/console/login",
            data={"token": token[1], "user": "ops", "password": password, "next": ""},
        )
    pages = ["/console/destinations", "/console/deliveries", "/metrics", "/openapi.json"]
    for page in pages:
        answer = await client.get(page)
        assert answer.status_code == 200, page
        found = leaks(answer.text, values, basic=("ops", values["basic_auth_password"]))
        assert not found, f"{page} shows the secrets of {found}"


async def outcomes_reached(database_url: str) -> None:
    """Wait until each destination of :data:`SUCCEEDING` delivered every event routed to it
    and each of :data:`FAILING` made a failed attempt of each."""
    engine = create_engine(database_url)

    async def reached() -> bool:
        rows = await inspect.list_deliveries(engine, limit=1000)
        by_destination: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_destination.setdefault(row["destination"], []).append(row)
        return all(
            by_destination.get(name)
            and all(r["status"] == "succeeded" for r in by_destination[name])
            for name in SUCCEEDING
        ) and all(
            by_destination.get(name) and all(r["attempts"] >= 1 for r in by_destination[name])
            for name in FAILING
        )

    try:
        await eventually(reached, timeout=RUN_SECONDS)
    finally:
        await engine.dispose()


async def operators_output(tmp_path: Path, database_url: str) -> str:
    """What the operators' commands print about the run: the destinations, every delivery with
    its last error, and the attempts of a delivery of each failing destination (one command at
    a time: each takes seconds of a busy machine's CPU)."""
    engine = create_engine(database_url)
    try:
        rows = await inspect.list_deliveries(engine, limit=1000)
    finally:
        await engine.dispose()
    failed = {row["destination"]: row["id"] for row in rows if row["destination"] in FAILING}
    commands = [
        ("destinations", "list"),
        ("deliveries", "list", "--limit", "1000"),
        ("deliveries", "list", "--json", "--limit", "1000"),
        *(("deliveries", "show", delivery, "--json") for delivery in failed.values()),
    ]
    return "\n".join([await relay_command(tmp_path, *args) for args in commands])


@contextmanager
def amqp_user(password: str) -> Iterator[tuple[str, str]]:
    """A vhost and a RabbitMQ user of the run's own with ``password``: (vhost, user)."""
    vhost, _ = new_vhost()
    user = f"relay-secrets-{uuid.uuid4().hex[:8]}"
    try:
        # "--": a random password may begin with "-", which rabbitmqctl reads as options.
        rabbitmqctl("add_user", user, "--", password)
        try:
            rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
            yield vhost, user
        finally:
            rabbitmqctl("delete_user", user)
    finally:
        rabbitmqctl("delete_vhost", vhost)


@asynccontextmanager
async def services_of_the_run(
    tmp_path: Path, values: dict[str, str], *, scaled: bool
) -> AsyncIterator[Services]:
    """The sink, a private Redis, a RabbitMQ user, a JetStream stream, an MQTT topic root and
    (scaled) a PostgreSQL database, each with the run's secret."""
    async with serving(Sink()) as sink, shared_server() as nats_client:
        sink.answers["/fail"] = Answer(status=500, body=b"down for maintenance")
        js = nats_client.jetstream()
        stream = await create_stream(js)
        database = None
        try:
            with (
                private_redis(tmp_path / "redis", values["redis_password"]) as redis_url,
                amqp_user(values["amqp_password"]) as (vhost, user),
            ):
                if scaled:
                    database, _ = await create_postgres_database("relay_secrets")
                database_url = postgres_url(values, database) if database else None
                services = Services(
                    sink, redis_url, vhost, user, stream, unique_root(), database_url
                )
                try:
                    yield services
                finally:
                    for process in services.processes:
                        await asyncio.to_thread(stop_process, process)
        finally:
            await delete_stream(js, stream)
            if database:
                await drop_postgres_database(database)


def printed_by(tmp_path: Path) -> dict[str, str]:
    """Every output file of the run's processes, by name."""
    return {
        path.name: path.read_text(encoding="utf-8", errors="replace")
        for path in sorted(tmp_path.glob("*.out")) + sorted(tmp_path.glob("*.err"))
    }


def assert_nothing_leaked(outputs: dict[str, str], values: dict[str, str]) -> None:
    basic = ("ops", values["basic_auth_password"])
    leaked = {name: leaks(text, values, basic=basic) for name, text in outputs.items()}
    assert not any(leaked.values()), {name: places for name, places in leaked.items() if places}


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_embedded_serve_prints_no_secret(tmp_path: Path, log_format: str) -> None:
    values = random_secrets()
    async with services_of_the_run(tmp_path, values, scaled=False) as services:
        (tmp_path / "relay.toml").write_text(config_toml(values, services, tmp_path))
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        server = relay_process(
            tmp_path, "serve", "serve", "--port", str(port), log_format=log_format
        )
        services.processes.append(server)
        await started(base_url, server, tmp_path / "serve.err")
        await send_callbacks(base_url, values)
        await outcomes_reached(f"sqlite:///{tmp_path / 'relay.db'}")
        operators = await operators_output(tmp_path, f"sqlite:///{tmp_path / 'relay.db'}")
    outputs = printed_by(tmp_path) | {"operators' commands": operators}
    assert_logged_at_debug(outputs["serve.err"], log_format)
    assert_nothing_leaked(outputs, values)


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_scaled_serve_and_worker_print_no_secret(tmp_path: Path, log_format: str) -> None:
    values = random_secrets()
    async with services_of_the_run(tmp_path, values, scaled=True) as services:
        assert services.database_url is not None
        (tmp_path / "relay.toml").write_text(config_toml(values, services, tmp_path))
        upgrade = await relay_command(tmp_path, "db", "upgrade")
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        server = relay_process(
            tmp_path, "serve", "serve", "--port", str(port), log_format=log_format
        )
        services.processes.append(server)
        worker = relay_process(tmp_path, "worker", "worker", log_format=log_format)
        services.processes.append(worker)
        await started(base_url, server, tmp_path / "serve.err")
        await send_callbacks(base_url, values)
        await outcomes_reached(services.database_url)
        operators = await operators_output(tmp_path, services.database_url)
    outputs = printed_by(tmp_path) | {"operators' commands": operators + upgrade}
    assert_logged_at_debug(outputs["worker.err"], log_format)
    assert_nothing_leaked(outputs, values)


def assert_logged_at_debug(text: str, log_format: str) -> None:
    """The run did log at debug, in the format asked for (else its silence would prove nothing)."""
    lines = text.splitlines()
    if log_format == "json":
        levels = {json.loads(line)["level"] for line in lines if line.startswith("{")}
    else:
        levels = {word for line in lines for word in line.split()[2:3]}
        levels = {level.lower() for level in levels}
    assert "debug" in levels, text[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_generated_secrets_are_printed_for_the_operator_but_never_logged(
    tmp_path: Path, log_format: str
) -> None:
    """Without sources nor console users, `relay serve` generates a token and a console
    password and prints them on standard output (the callback URLs, the console line) at every
    start; its log (standard error) holds neither, nor the console's session key."""
    database = tmp_path / "relay.db"
    (tmp_path / "relay.toml").write_text(
        f'database_url = "sqlite:///{database}"\n'  # and a destination, whose client logs at debug
        f'[destinations.crm]\ntype = "http"\nurl = "http://127.0.0.1:{free_port()}/in"\n'
    )
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = relay_process(tmp_path, "serve", "serve", "--port", str(port), log_format=log_format)
    try:
        await started(base_url, server, tmp_path / "serve.err")
        printed = (tmp_path / "serve.out").read_text()
        token = re.findall(r"\?token=(\S+)$", printed, re.MULTILINE)[0]
        password = re.findall(r"user admin, password (\S+)$", printed, re.MULTILINE)[0]
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            answer = await client.post(
                f"/hooks/sms/inbound?token={token}", json=factories.sms_inbound()
            )
            assert answer.status_code == 200
            await client.post(f"/hooks/sms/inbound/{token}", content=b"{}")
            form = await client.get("/console/login")
            login = LOGIN_TOKEN.search(form.text)
            assert login is not None
            await client.post(
                "/console/login",
                data={"token": login[1], "user": "admin", "password": password, "next": ""},
            )
    finally:
        await asyncio.to_thread(stop_process, server)
    generated = await kept_values(f"sqlite:///{database}")
    assert set(generated) == {"default_source_token", "console_password", "console_session_key"}
    assert generated["default_source_token"] == token
    assert generated["console_password"] == password
    outputs = printed_by(tmp_path)
    assert_logged_at_debug(outputs["serve.err"], log_format)
    basic = ("admin", password)
    assert not leaks(outputs["serve.err"], generated, basic=basic)
    for line in outputs["serve.out"].splitlines():
        shown = leaks(line, generated, basic=basic)
        assert (
            not shown
            or (shown == ["default_source_token"] and "/hooks/" in line)
            or (shown == ["console_password"] and line.startswith("Console: "))
        ), line


async def kept_values(database_url: str) -> dict[str, str]:
    """The values the installation generated and keeps in its database, by key."""
    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT key, value FROM relay_instance_settings"))
            return {str(key): str(value) for key, value in rows}
    finally:
        await engine.dispose()


MARKER = "Mk7-marker-secret-Zq9"
"""A secret written into a setting that is refused for another reason."""


def destination(kind: str, url: str, more: str = "") -> str:
    """A ``[destinations.d]`` table of ``kind`` sending to ``url``, with ``more`` lines."""
    return f'[destinations.d]\ntype = "{kind}"\nurl = "{url}"\n{more}'


REFUSED_SETTINGS = [
    f'[console.users]\nops = "{MARKER[:8]}"',
    destination("http", f"http://u:{MARKER}@"),
    destination("http", f"ftp://u:{MARKER}@host/"),
    destination("http", "http://host/", f'secret = "whsec_{MARKER}!"'),
    destination("http", "http://host/", f'headers = {{"X Key" = "{MARKER}"}}'),
    destination("redis-stream", f"redis://:{MARKER}@host/x", 'stream = "s"'),
    destination("arq", f"rediss://:{MARKER}@host:port/0", 'function = "f"'),
    destination("amqp", f"amqp://u:{MARKER}@host:x/", 'exchange = "e"'),
    destination("amqp", f"amqp://u:p@host/?token={MARKER}", 'exchange = "e"'),
    destination("amqp", f"amqp://u:p@host/?name={MARKER}&name=x", 'exchange = "e"'),
    destination("nats", f"nats://{MARKER}@h1,tls://{MARKER}@h2", 'subject = "s"'),
    destination("mqtt", f"mqtt://:{MARKER}@host", 'topic = "t"'),
    destination("mqtt", f"mqtt://u:{MARKER}%zz@host", 'topic = "t"'),
    f'database_url = "mysql://u:{MARKER}@host/db"',
    f'database_url = "sqlite://u:{MARKER}@host/db"',
    f'token = "{MARKER}',
]


@pytest.mark.parametrize("toml", REFUSED_SETTINGS)
def test_a_refused_setting_is_named_without_its_secret(tmp_path: Path, toml: str) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(toml)
    with pytest.raises(SettingsError) as refused:
        load_settings(config)
    assert MARKER not in str(refused.value) and MARKER[:8] not in str(refused.value)


def test_a_table_variable_that_is_not_json_is_named_without_its_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAY_SOURCES", f'{{"eu": {{"token": "{MARKER}"')
    with pytest.raises(SettingsError) as refused:
        load_settings(None)
    assert "RELAY_SOURCES" in str(refused.value) and MARKER not in str(refused.value)


@pytest.mark.parametrize(
    "redis_url", [f"http://u:{MARKER}@127.0.0.1:6379/0", f"redis://:{MARKER}@127.0.0.1:1/0"]
)
async def test_a_redis_that_cannot_be_used_is_named_without_its_password(redis_url: str) -> None:
    with pytest.raises(SettingsError) as refused:
        await open_pool(redis_url)
    assert "127.0.0.1" in str(refused.value) and MARKER not in str(refused.value)
