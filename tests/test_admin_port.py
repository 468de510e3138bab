"""`admin_port`: `relay serve` serves the console, `/metrics` and `/openapi.json` on a listener
of their own, and only the receivers and health checks on the public port; without it, one port
serves everything as before."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from receivers.problems import PROBLEM_MEDIA_TYPE
from relay.server.admin_listener import AdminSplit
from relay.server.runtime import start
from relay.settings import Settings, SettingsError, load_settings
from relay.simulator import factories
from tests.conftest import TOKEN
from tests.metrics_support import sample
from tests.store_support import blocking_eventually, child_environment
from tests.support import free_port, stop_process

SERVE = [sys.executable, "-m", "relay", "serve"]
CONSOLE_PASSWORD = "a-console-password-for-tests"
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND"]
ADMIN_ONLY = [
    "/metrics",
    "/openapi.json",
    "/console",
    "/console/",
    "/console/login",
    "/console/events",
    "/console/static/console.css",
    "/console%2Flogin",
]
NOWHERE = [
    "/",
    "/nope",
    "/metrics/",
    "//metrics",
    "/hooks",
    "/consoles",
    "/docs",
    "/%2e%2e/metrics",
]
HOOKS = ["/hooks/sms/inbound", "/hooks/sms/dlr/", "/hooks/conversations", "/hooks/unknown"]


@dataclass(frozen=True)
class Server:
    public: str
    admin: str
    output: Path


def write_config(directory: Path) -> Path:
    config = directory / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{directory / "relay.db"}"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        f'[console.users]\nadmin = "{CONSOLE_PASSWORD}"\n'
    )
    return config


@contextlib.contextmanager
def relay_serve(directory: Path, port: int, **variables: str) -> Iterator[Path]:
    """`relay serve` in a subprocess, until it listens; its output's file."""
    output = directory / "serve.log"
    environment = {k: v for k, v in child_environment().items() if not k.startswith("RELAY_")}
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [*SERVE, "--config", str(write_config(directory)), "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=environment | {"PYTHONUNBUFFERED": "1"} | variables,
            cwd=directory,
        )
    try:
        blocking_eventually(
            lambda: "Uvicorn running on" in output.read_text() or process.poll() is not None
        )
        assert process.poll() is None, output.read_text()
        yield output
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("admin-port")
    public, admin = free_port(), free_port()
    with relay_serve(directory, public, RELAY_ADMIN_PORT=str(admin)) as output:
        yield Server(f"http://127.0.0.1:{public}", f"http://127.0.0.1:{admin}", output)


def assert_not_found(answer: httpx.Response, method: str) -> None:
    assert answer.status_code == 404, (method, answer.request.url, answer.text)
    assert answer.headers["content-type"] == PROBLEM_MEDIA_TYPE
    if method != "HEAD":
        problem = answer.json()
        assert problem["status"] == 404 and problem["title"] == "Not Found"


def test_the_public_port_takes_callbacks_and_answers_health_checks(server: Server) -> None:
    with httpx.Client(base_url=server.public) as client:
        stored = client.post(f"/hooks/sms/inbound?token={TOKEN}", json=factories.sms_inbound())
        assert stored.status_code == 200, stored.text
        assert client.get("/hooks/sms/dlr/").status_code == 401  # the receiver's own answer
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"status": "ready"}
        assert client.post("/healthz").status_code == 405  # the app's own answer
    stored_labels = {"source": "default", "kind": "sms.inbound", "outcome": "stored"}

    def counted() -> bool:  # one process: the admin port serves the public port's counters
        metrics = httpx.get(f"{server.admin}/metrics").text
        return sample(metrics, "relay_callbacks_total", **stored_labels) == 1

    blocking_eventually(counted)


@pytest.mark.parametrize("path", ADMIN_ONLY + NOWHERE)
def test_the_public_port_answers_404_to_anything_else_whatever_the_method(
    server: Server, path: str
) -> None:
    with httpx.Client() as client:
        for method in METHODS:
            answer = client.request(method, f"{server.public}{path}", content=b"{}")
            assert_not_found(answer, method)


def test_the_admin_port_serves_the_console_metrics_and_openapi(server: Server) -> None:
    with httpx.Client(base_url=server.admin) as client:
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        assert "relay_store_figures_age_seconds" in metrics.text
        assert "/hooks/sms/inbound" in client.get("/openapi.json").json()["paths"]
        home = client.get("/console")
        assert (home.status_code, home.headers["location"]) == (303, "/console/events")
        form = client.get("/console/login")
        assert form.status_code == 200 and "text/html" in form.headers["content-type"]
        token = re.search(r'name="token" value="([^"]*)"', form.text)
        assert token is not None
        login = client.post(
            "/console/login",
            data={"token": token[1], "user": "admin", "password": CONSOLE_PASSWORD, "next": ""},
        )
        assert login.status_code == 303, login.text
        assert client.get("/console/events").status_code == 200
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize("path", HOOKS + NOWHERE)
def test_the_admin_port_takes_no_callback(server: Server, path: str) -> None:
    with httpx.Client() as client:
        for method in METHODS:
            answer = client.request(method, f"{server.admin}{path}?token={TOKEN}", content=b"{}")
            assert_not_found(answer, method)


def test_the_console_url_printed_and_logged_is_the_admin_address(server: Server) -> None:
    output = server.output.read_text()
    assert f"Console: {server.admin}/console (users from [console.users])" in output
    assert f"Uvicorn running on {server.public} (Press CTRL+C to quit)" in output
    assert f"admin listener on {server.admin}: /console, " in output


def test_the_connection_guard_bounds_the_admin_port_too(server: Server) -> None:
    port = int(server.admin.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 64 * 1024 + b"\r\n\r\n"
        )
        answer = sock.recv(1024)
    assert answer.startswith(b"HTTP/1.1 431 ")


def test_without_admin_port_one_port_serves_everything(tmp_path: Path) -> None:
    port = free_port()
    with relay_serve(tmp_path, port) as output:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            callback = client.post(f"/hooks/sms/dlr?token={TOKEN}", json=factories.sms_dlr())
            assert callback.status_code == 200
            assert client.get("/metrics").status_code == 200
            assert client.get("/openapi.json").status_code == 200
            assert client.get("/console/login").status_code == 200
            assert client.get("/healthz").status_code == 200
        text = output.read_text()
    assert f"Console: http://127.0.0.1:{port}/console " in text
    assert "admin listener" not in text


# --- every route of the app, in-process: served as the app serves it on its listener --------

PUBLIC_PORT, ADMIN_PORT = 8000, 9000


def route_paths(routes: list[BaseRoute], prefix: str = "") -> Iterator[str]:
    """Every path of the app's routes, a path parameter filled in."""
    for route in routes:
        if isinstance(route, Mount):
            yield from route_paths(route.routes, prefix + route.path)
        elif isinstance(route, Route):
            yield re.sub(r"\{[^}]*\}", "x", prefix + route.path)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[ASGIApp]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'relay.db'}",
        sources={"default": {"token": TOKEN}, "eu": {"token": TOKEN}},
        console={"users": {"admin": CONSOLE_PASSWORD}},
    )
    runtime = await start(settings)
    app = runtime.app()
    try:
        async with app.router.lifespan_context(app):
            yield app
    finally:
        await runtime.engine.dispose()


async def test_every_route_is_served_on_exactly_the_listener_it_belongs_to(app: ASGIApp) -> None:
    split = AdminSplit(app, ADMIN_PORT)
    paths = sorted(set(route_paths(app.routes)))  # type: ignore[attr-defined]
    assert "/console/events/x" in paths and "/hooks/eu/sms/inbound" in paths
    for path in paths:
        public = path.startswith("/hooks/") or path in ("/healthz", "/readyz")
        admin = not path.startswith("/hooks/")
        for method in ("GET", "POST"):
            alone = await answer(app, PUBLIC_PORT, method, path)
            for port, served in ((PUBLIC_PORT, public), (ADMIN_PORT, admin)):
                got = await answer(split, port, method, path)
                if served:  # as the app answers (a console form's token differs each time)
                    assert got.status_code == alone.status_code, (port, method, path)
                    assert got.headers.get("content-type") == alone.headers.get("content-type")
                else:
                    assert_not_found(got, method)
                    assert got.json()["detail"] == f"No receiver at {path}."


async def answer(app: ASGIApp, port: int, method: str, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)  # the scope's server is the URL's host and port
    async with httpx.AsyncClient(transport=transport, base_url=f"http://relay:{port}") as client:
        return await client.request(method, path, content=b"{}", follow_redirects=False)


# --- the settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "expected a whole number in digits"),
        (" ", "expected a whole number in digits"),
        ("-1", "expected a whole number in digits"),
        ("9000.0", "expected a whole number in digits"),
        ("nine", "expected a whole number in digits"),
        ("9" * 5000, "expected a whole number in digits"),
        ("0", "greater than or equal to 1"),
        ("65536", "less than or equal to 65535"),
    ],
)
def test_an_admin_port_variable_that_is_no_port_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("RELAY_ADMIN_PORT", value)
    with pytest.raises(SettingsError, match="admin_port \\(from RELAY_ADMIN_PORT\\)") as refused:
        load_settings(None)
    assert message in str(refused.value)
    assert "9" * 100 not in str(refused.value)


@pytest.mark.parametrize("value", ["true", "9000.5", '"9e3"', "[9000]", "-9000", "0", "70000"])
def test_an_admin_port_in_the_file_is_a_whole_number_from_1_to_65535(
    tmp_path: Path, value: str
) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(f"admin_port = {value}\n")
    with pytest.raises(SettingsError, match="admin_port"):
        load_settings(config)


@pytest.mark.parametrize(
    "host", ["", " ", "local host", "127.0.0.1 ", "a\x00b", "x" * 300, "under_score", "-a", "[::1]"]
)
def test_an_admin_host_that_names_no_interface_is_refused(tmp_path: Path, host: str) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(f"admin_port = 9000\nadmin_host = {json.dumps(host)}\n")
    with pytest.raises(SettingsError, match="admin_host") as refused:
        load_settings(config)
    assert "not an IP address or a host name" in str(refused.value)
    assert "x" * 100 not in str(refused.value)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::1", "::", "localhost", "admin.lan"])
def test_an_admin_host_is_an_address_or_a_host_name(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("RELAY_ADMIN_PORT", "9000")
    monkeypatch.setenv("RELAY_ADMIN_HOST", host)
    settings = load_settings(None)
    assert (settings.admin_host, settings.admin_port) == (host, 9000)


def test_an_admin_host_without_its_port_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAY_ADMIN_PORT", raising=False)
    monkeypatch.setenv("RELAY_ADMIN_HOST", "0.0.0.0")
    with pytest.raises(SettingsError, match="admin_host is set but admin_port is not"):
        load_settings(None)


def test_by_default_there_is_no_admin_port(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RELAY_ADMIN_PORT", "RELAY_ADMIN_HOST"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings(None)
    assert (settings.admin_port, settings.admin_host) == (None, "127.0.0.1")
