"""`relay serve` binds its ports before anything else: a port it cannot listen on (taken, not
this machine's, a host that does not resolve or is no host at all) is one line and exit status 1
at once, before the database is opened, any URL is printed or the worker starts."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette

from relay.cli import main
from relay.server.listening import listening
from relay.server.serve import ListeningServer, server_config
from relay.settings import Settings, SettingsError
from tests.store_support import blocking_eventually, child_environment
from tests.support import free_port, stop_process

SERVE = [sys.executable, "-m", "relay", "serve"]
STARTED = "Uvicorn running on"


@contextlib.contextmanager
def taken_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port some other program listens on, meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as other:
        other.bind((host, 0))
        other.listen()
        yield int(other.getsockname()[1])


def write_config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "relay.db"}"\n{extra}\n'
        '[console.users]\nadmin = "a-console-password-for-tests"\n'
    )
    return config


def environment(**variables: str) -> dict[str, str]:
    kept = {k: v for k, v in child_environment().items() if not k.startswith("RELAY_")}
    return kept | {"PYTHONUNBUFFERED": "1"} | variables


def serve_once(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """`relay serve` in a subprocess that is expected to stop by itself."""
    return subprocess.run(
        [*SERVE, "--config", str(write_config(tmp_path)), *args],
        capture_output=True,
        text=True,
        env=environment(**variables),
        cwd=tmp_path,
        timeout=60,
    )


def test_a_taken_port_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with taken_port() as port:
        result = serve_once(tmp_path, "--port", str(port))
    assert result.returncode == 1
    assert result.stdout == ""  # no callback URLs, no console URL
    assert result.stderr == f"Error: cannot listen on 127.0.0.1:{port}: address already in use\n"
    assert not (tmp_path / "relay.db").exists()  # no database, so no writer and no worker


def test_a_taken_admin_port_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with taken_port() as port:
        result = serve_once(tmp_path, "--port", str(free_port()), RELAY_ADMIN_PORT=str(port))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: cannot listen on 127.0.0.1:{port} (admin_port): address already in use\n"
    )
    assert not (tmp_path / "relay.db").exists()


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("", "not an IP address or a host name: ''"),
        (" 127.0.0.1", "not an IP address or a host name"),
        ("bad host", "not an IP address or a host name"),
        ("local\x00host", "not an IP address or a host name"),
        ("h" * 5000, "not an IP address or a host name"),
        ("-leading-hyphen", "not an IP address or a host name"),
        ("nowhere.invalid", "the host does not resolve"),
        ("192.0.2.1", "the address is not one of this machine's"),  # TEST-NET-1
        ("999.1.1.1", "the host does not resolve"),
    ],
)
def test_a_host_that_cannot_be_listened_on_is_one_line(
    tmp_path: Path, host: str, reason: str
) -> None:
    config = write_config(tmp_path)
    result = CliRunner().invoke(
        main, ["serve", "--config", str(config), "--host", host, "--port", "0"], env={}
    )
    assert result.exit_code == 1, result.output
    [line] = result.output.splitlines()
    assert line.startswith("Error: cannot listen on ") and reason in line
    assert "h" * 100 not in line  # a huge value is not repeated whole
    assert not (tmp_path / "relay.db").exists()


BAD_PORTS = ["-1", "65536", "99999999999999999999", "eighty", "8.5", "0x50"]


@pytest.mark.parametrize("port", [*BAD_PORTS, ""])
def test_a_port_option_out_of_range_or_not_a_number_is_refused(tmp_path: Path, port: str) -> None:
    config = write_config(tmp_path)
    result = CliRunner().invoke(main, ["serve", "--config", str(config), "--port", port])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port'" in result.output
    assert not (tmp_path / "relay.db").exists()


@pytest.mark.parametrize("port", BAD_PORTS)
@pytest.mark.parametrize("variable", ["RELAY_PORT", "PORT"])
def test_a_port_variable_out_of_range_or_not_a_number_is_refused(
    tmp_path: Path, port: str, variable: str
) -> None:
    config = write_config(tmp_path)
    env = {"RELAY_PORT": None, "PORT": None, variable: port}
    result = CliRunner().invoke(main, ["serve", "--config", str(config)], env=env)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port'" in result.output
    assert not (tmp_path / "relay.db").exists()


def test_the_admin_port_must_differ_from_the_public_one(tmp_path: Path) -> None:
    port = free_port()
    result = serve_once(tmp_path, "--port", str(port), RELAY_ADMIN_PORT=str(port))
    assert result.returncode == 1
    assert result.stderr == (
        f"Error: admin_port {port} is also the public port (--port): the admin listener needs "
        "a port of its own\n"
    )
    assert not (tmp_path / "relay.db").exists()


@contextlib.contextmanager
def running(tmp_path: Path, *args: str, **variables: str) -> Iterator[Path]:
    """`relay serve` started in a subprocess until its app has started; its output's file."""
    output = tmp_path / "serve.log"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [*SERVE, "--config", str(write_config(tmp_path)), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=environment(**variables),
            cwd=tmp_path,
        )
    try:
        blocking_eventually(lambda: STARTED in output.read_text() or process.poll() is not None)
        assert process.poll() is None, output.read_text()
        yield output
    finally:
        stop_process(process)


def test_port_0_serves_a_free_port_and_prints_it(tmp_path: Path) -> None:
    with running(tmp_path, "--port", "0") as output:
        text = output.read_text()
        match = re.search(r"Console: http://127\.0\.0\.1:(\d+)/console ", text)
        assert match is not None, text
        port = int(match.group(1))
        assert port != 0
        assert f"Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)" in text
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200


def test_ipv6_loopback_is_served_and_shown_in_brackets(tmp_path: Path) -> None:
    port = free_port()
    with running(tmp_path, "--host", "::1", "--port", str(port)) as output:
        text = output.read_text()
        assert f"Console: http://[::1]:{port}/console " in text
        assert f"Uvicorn running on http://[::1]:{port} " in text
        assert httpx.get(f"http://[::1]:{port}/readyz").status_code == 200


def test_a_name_resolving_to_several_addresses_is_served_on_each(tmp_path: Path) -> None:
    addresses = {info[4][0] for info in socket.getaddrinfo("localhost", 0, socket.AF_UNSPEC)}
    port = free_port()
    with running(tmp_path, "--host", "localhost", "--port", str(port)):
        for address in addresses:
            host = f"[{address}]" if ":" in address else address
            assert httpx.get(f"http://{host}:{port}/healthz").status_code == 200
    assert "127.0.0.1" in addresses


def test_the_port_is_free_again_after_a_stop(tmp_path: Path) -> None:
    port = free_port()
    with running(tmp_path, "--port", str(port)):
        pass
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # nothing of the server holds it


def test_a_settings_error_after_binding_frees_the_port(tmp_path: Path) -> None:
    port = free_port()
    result = serve_once(
        tmp_path, "--port", str(port), RELAY_DATABASE_URL="postgresql://nobody@127.0.0.1:1/x"
    )
    assert result.returncode == 1
    assert result.stderr.startswith("Error: cannot connect to the database at ")
    assert len(result.stderr.splitlines()) == 1
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


async def test_a_port_taken_between_its_bind_and_the_start_is_one_line_and_stops_the_app() -> None:
    """Two processes may bind a port with SO_REUSEADDR while neither listens; the one that
    listens second is told so in one line, after its app's start has been undone."""
    lifespan_events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        lifespan_events.append("started")
        yield
        lifespan_events.append("stopped")

    app = Starlette(lifespan=lifespan)
    settings = Settings()
    with listening(settings, "127.0.0.1", 0) as listeners, socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", listeners.public.port))  # allowed: nothing listens yet
        other.listen()
        config = server_config(app, settings, "127.0.0.1", listeners.public.port, "warning")
        server = ListeningServer(config, listeners)
        with pytest.raises(SettingsError) as refused:
            await server.serve(sockets=listeners.sockets)
    assert str(refused.value) == "cannot listen on the ports bound: address already in use"
    assert lifespan_events == ["started", "stopped"]


def test_connections_are_refused_until_the_server_serves() -> None:
    """The ports are bound at once but listen only once the app has started: a TCP health
    check does not pass meanwhile."""
    with (
        listening(Settings(), "127.0.0.1", 0) as listeners,
        pytest.raises(ConnectionRefusedError),
    ):
        socket.create_connection(("127.0.0.1", listeners.public.port), timeout=5).close()
