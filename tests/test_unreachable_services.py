"""`relay serve` and `relay worker` with Redis or PostgreSQL unreachable: one clear line, no trace.

The real command line runs as a subprocess against services on 127.0.0.1 that refuse, or answer
with an error (unknown database, refused login), so what the operator sees is what is asserted.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url

from receivers.store import create_engine
from relay.server.runtime import connect_database
from relay.settings import SettingsError
from tests.conftest import PG_ADMIN_DSN, REDIS_URL, service_missing
from tests.outage_support import postgres_refusing_logins
from tests.support import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "hunter2-never-shown"
TIMEOUT = 60  # seconds; each command ends in about one (its import time)


def write_config(tmp_path: Path, database_url: str, redis_url: str | None = None) -> Path:
    config = tmp_path / "relay.toml"
    lines = [f'database_url = "{database_url}"']
    if redis_url is not None:
        lines.append(f'redis_url = "{redis_url}"')
    config.write_text("\n".join(lines) + "\n")
    return config


async def relay(
    command: str, config: Path, extra_env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run `python -m relay <command> --config <config>` (with ``extra_env`` added to this
    environment); its exit code and all it printed."""
    args = [sys.executable, "-m", "relay", command, "--config", str(config)]
    if command == "serve":
        args += ["--port", str(free_port())]
    env = {key: value for key, value in os.environ.items() if not key.startswith("RELAY_")}
    env.update(extra_env or {})
    process = await asyncio.create_subprocess_exec(
        *args,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, (out + err).decode()


def assert_one_clear_line(code: int, output: str, *expected: str) -> str:
    """Exit code != 0, no traceback, no password, and one line saying what cannot be reached."""
    assert code != 0, output
    assert "Traceback" not in output, output
    assert PASSWORD not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    [line] = lines
    for part in expected:
        assert part in line, line
    return line


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'relay.db'}"


@pytest.fixture
async def postgresql() -> URL:
    """The machine's PostgreSQL (the test is skipped without it)."""
    try:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        service_missing("PostgreSQL", exc)
    await conn.close()
    return make_url(PG_ADMIN_DSN).set(drivername="postgresql+asyncpg")


@pytest.mark.parametrize("command", ["serve", "worker"])
async def test_redis_refusing(command: str, sqlite_url: str, tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, sqlite_url, f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    line = assert_one_clear_line(
        *await relay(command, config), "Redis", f"127.0.0.1:{port}", "connection refused"
    )
    assert line.startswith("Error: ")


@pytest.mark.parametrize("command", ["serve", "worker"])
async def test_a_sqlite_file_that_cannot_be_opened(command: str, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'no-such-directory' / 'relay.db'}"
    config = write_config(tmp_path, database_url, REDIS_URL if command == "worker" else None)
    assert_one_clear_line(*await relay(command, config), "database", "unable to open")


async def test_a_sqlite_file_that_cannot_be_opened_never_reaches_the_async_driver(
    tmp_path: Path,
) -> None:
    """Its thread would report the failure to the event loop, which may be closed by then: a
    traceback of that thread after the one-line error, in about one start out of five."""
    engine = create_engine(f"sqlite:///{tmp_path / 'no-such-directory' / 'relay.db'}")
    asked: list[object] = []
    event.listen(engine.sync_engine, "do_connect", lambda *args: asked.append(args))
    try:
        with pytest.raises(SettingsError, match="unable to open database file"):
            await connect_database(engine)
    finally:
        await engine.dispose()
    assert asked == []


@pytest.mark.parametrize("command", ["serve", "worker"])
async def test_postgresql_refusing(command: str, tmp_path: Path) -> None:
    port = free_port()
    database_url = f"postgresql+asyncpg://postgres:{PASSWORD}@127.0.0.1:{port}/x"
    config = write_config(tmp_path, database_url, REDIS_URL if command == "worker" else None)
    assert_one_clear_line(
        *await relay(command, config), "database", f"127.0.0.1:{port}", "connection refused"
    )


async def test_redis_refusing_the_password(sqlite_url: str, tmp_path: Path) -> None:
    # the machine's Redis has no password: AUTH with one is refused
    redis_url = REDIS_URL.replace("redis://", f"redis://:{PASSWORD}@", 1)
    config = write_config(tmp_path, sqlite_url, redis_url)
    assert_one_clear_line(*await relay("serve", config), "Redis", "AUTH")


@pytest.mark.parametrize("command", ["serve", "worker"])
async def test_unknown_postgresql_database(command: str, postgresql: URL, tmp_path: Path) -> None:
    name = f"relay_missing_{uuid.uuid4().hex[:8]}"
    url = postgresql.set(password=PASSWORD, database=name).render_as_string(hide_password=False)
    config = write_config(tmp_path, url, REDIS_URL if command == "worker" else None)
    assert_one_clear_line(*await relay(command, config), "database", f'"{name}" does not exist')


@pytest.fixture
async def refusing_postgresql() -> AsyncIterator[int]:
    """A port where a stand-in PostgreSQL asks for a password and refuses it (what a wrong
    password gets; the machine's PostgreSQL trusts every login)."""
    refusal = 'password authentication failed for user "app"'
    async with postgres_refusing_logins("28P01", refusal, ask_password=True) as port:
        yield port


@pytest.mark.parametrize("command", ["serve", "worker"])
async def test_postgresql_refusing_the_login(
    command: str, refusing_postgresql: int, tmp_path: Path
) -> None:
    database_url = f"postgresql+asyncpg://app:{PASSWORD}@127.0.0.1:{refusing_postgresql}/app"
    config = write_config(tmp_path, database_url, REDIS_URL if command == "worker" else None)
    assert_one_clear_line(
        *await relay(command, config), "database", "password authentication failed"
    )


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize("certificates", ["missing", "not-a-certificate"])
async def test_trusted_certificates_that_cannot_be_loaded(
    command: str, certificates: str, sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "ca.pem"
    if certificates == "not-a-certificate":
        path.write_text("not a certificate\n")
    config = write_config(tmp_path, sqlite_url, REDIS_URL if command == "worker" else None)
    code, output = await relay(command, config, {"SSL_CERT_FILE": str(path)})
    line = assert_one_clear_line(code, output, "trusted CA certificates", f"SSL_CERT_FILE={path}")
    assert "database" not in line
