"""The brokers' clients are the optional ``callback-relay[brokers]`` extra: without them
`relay serve` runs with HTTP (and Redis, arq) destinations, and a broker destination is a
one-line configuration error naming the extra at the start of `relay serve` and `relay worker`,
not an ImportError. Each test runs `relay` in a subprocess whose imports of the hidden modules
fail, as they would where the extra is not installed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from relay.destinations.broker_clients import BROKERS_INSTALL
from relay.simulator import factories
from tests.conftest import TOKEN
from tests.store_support import blocking_eventually, child_environment, eventually
from tests.support import Sink, free_port, serving, stop_process

BROKER_MODULES = "aio_pika,aiormq,pamqp,yarl,nats,paho"
"""What `pip install callback-relay` leaves out (the extra's packages and aio-pika's aiormq)."""
HIDING = '''\
import os
import sys
from importlib.abc import MetaPathFinder

HIDDEN = set(os.environ["HIDDEN_MODULES"].split(","))


class Hidden(MetaPathFinder):
    """Refuses the hidden modules, as an interpreter without them does."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Hidden())
'''
TABLES = {
    "amqp": 'url = "amqp://guest:guest@127.0.0.1:5672/"\nexchange = "callbacks"',
    "nats": 'url = "nats://127.0.0.1:4222"\nsubject = "callbacks.{kind}"',
    "mqtt": 'url = "mqtt://127.0.0.1:1883"\ntopic = "callbacks/{kind}"',
}
PACKAGES = {"amqp": "aio-pika", "nats": "nats-py", "mqtt": "paho-mqtt"}


def without(tmp_path: Path, modules: str = BROKER_MODULES) -> dict[str, str]:
    """An environment whose interpreters cannot import ``modules`` (joined by commas)."""
    hiding = tmp_path / "hiding"
    hiding.mkdir(exist_ok=True)
    (hiding / "sitecustomize.py").write_text(HIDING, encoding="utf-8")
    environment = {k: v for k, v in child_environment().items() if not k.startswith("RELAY_")}
    path = os.pathsep.join([str(hiding), environment["PYTHONPATH"]])
    return environment | {"PYTHONPATH": path, "HIDDEN_MODULES": modules, "PYTHONUNBUFFERED": "1"}


def write_config(tmp_path: Path, destination: str) -> Path:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "relay.db"}"\n'
        f"[destinations.bus]\n{destination}\n"
        '[console.users]\nadmin = "a-console-password-for-tests"\n',
        encoding="utf-8",
    )
    return config


def relay_once(
    tmp_path: Path, command: str, destination: str, modules: str = BROKER_MODULES
) -> subprocess.CompletedProcess[str]:
    """`relay COMMAND` without ``modules``, in a subprocess expected to stop by itself."""
    config = write_config(tmp_path, destination)
    return subprocess.run(
        [sys.executable, "-m", "relay", command, "--config", str(config)],
        capture_output=True,
        text=True,
        env=without(tmp_path, modules),
        cwd=tmp_path,
        timeout=60,
    )


def test_the_hidden_clients_cannot_be_imported(tmp_path: Path) -> None:
    for module in ("aio_pika", "pamqp", "yarl", "nats", "paho"):
        result = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            env=without(tmp_path),
            timeout=60,
        )
        assert result.returncode == 1
        assert f"No module named '{module}'" in result.stderr


@contextlib.contextmanager
def serving_http(tmp_path: Path, hook: str) -> Iterator[int]:
    """`relay serve` without the brokers' clients, relaying to the HTTP ``hook``, once started:
    its port. Its output is checked for tracebacks when it stops."""
    port = free_port()
    destination = f'type = "http"\nurl = "{hook}"\n[sources.default]\ntoken = "{TOKEN}"'
    config = write_config(tmp_path, destination)
    output = tmp_path / "serve.log"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "relay", "serve", "--config", str(config), "--port", f"{port}"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=without(tmp_path),
            cwd=tmp_path,
        )
    try:
        blocking_eventually(
            lambda: "Uvicorn running on" in output.read_text() or process.poll() is not None
        )
        assert process.poll() is None, output.read_text()
        yield port
    finally:
        stop_process(process)
    assert "Traceback" not in output.read_text()


async def test_serve_relays_to_an_http_destination_without_the_brokers_clients(
    tmp_path: Path,
) -> None:
    async with serving(Sink()) as sink:
        with serving_http(tmp_path, sink.url()) as port:
            body = factories.sms_inbound()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                stored = await client.post(f"/hooks/sms/inbound?token={TOKEN}", json=body)
            assert stored.status_code == 200
            delivered = await eventually(sink.bodies)
            assert json.loads(delivered[0])["payload"] == body


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize("kind", list(TABLES))
def test_a_broker_destination_without_its_client_is_one_line_naming_the_extra(
    tmp_path: Path, command: str, kind: str
) -> None:
    result = relay_once(tmp_path, command, f'type = "{kind}"\n{TABLES[kind]}')
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == f"Error: invalid configuration in {tmp_path / 'relay.toml'}:"
    assert len(lines) == 2, result.stderr
    assert lines[1].startswith(f"  destinations.bus.{kind}: Value error, {kind} destinations ")
    assert f"need {PACKAGES[kind]}, which is not installed" in lines[1]
    assert lines[1].endswith(BROKERS_INSTALL)
    assert BROKERS_INSTALL == "pip install 'callback-relay[brokers]'"
    assert result.stdout == ""


def test_a_missing_module_beside_the_client_is_named(tmp_path: Path) -> None:
    result = relay_once(tmp_path, "worker", f'type = "amqp"\n{TABLES["amqp"]}', modules="pamqp")
    assert result.returncode == 1
    assert "amqp destinations need aio-pika, which is not installed (no module pamqp): " in (
        result.stderr
    )


def test_a_broker_destination_is_refused_for_its_client_before_its_other_errors(
    tmp_path: Path,
) -> None:
    result = relay_once(tmp_path, "worker", 'type = "nats"\nurl = ""\nsubject = ""')
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 2
    assert "nats destinations need nats-py" in result.stderr
