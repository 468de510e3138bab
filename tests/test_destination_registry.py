"""The destination types are registered in one place: the registry lists every type a module
declares, settings refuse an unknown type naming the known ones, every type builds from its
table, and a broker's client library is loaded only where a destination of its type is built."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest

import relay.destinations
from relay.destinations import (
    TYPES,
    Destination,
    DestinationBase,
    DestinationType,
    build_destination,
    parse_destination_config,
    type_names,
)
from relay.settings import SettingsError, load_settings

TABLES: dict[str, dict[str, Any]] = {
    "http": {"url": "https://a.b/"},
    "redis-stream": {"url": "redis://127.0.0.1:6379/0", "stream": "s"},
    "arq": {"url": "redis://127.0.0.1:6379/0", "function": "f"},
    "amqp": {"url": "amqp://guest:guest@127.0.0.1:5672/", "exchange": "callbacks"},
    "nats": {"url": "nats://127.0.0.1:4222", "subject": "callbacks.{kind}"},
    "mqtt": {"url": "mqtt://127.0.0.1:1883", "topic": "callbacks/{kind}"},
}
"""A valid table of each type (every key but ``type``)."""
CLIENTS = {"amqp": "aio_pika", "nats": "nats", "mqtt": "paho"}


def _declared_types() -> list[DestinationType]:
    """The ``TYPE`` of every module of the package that declares one."""
    found = []
    for module in pkgutil.iter_modules(relay.destinations.__path__):
        loaded = importlib.import_module(f"relay.destinations.{module.name}")
        declared = getattr(loaded, "TYPE", None)
        if isinstance(declared, DestinationType):
            found.append(declared)
    return found


def _config_models(cls: type[DestinationBase]) -> set[type[DestinationBase]]:
    """Every settings model below ``cls`` that has a ``type``."""
    models = set()
    for sub in cls.__subclasses__():
        if "type" in sub.model_fields:
            models.add(sub)
        models |= _config_models(sub)
    return models


def test_the_registry_lists_every_type_a_module_declares() -> None:
    declared = _declared_types()
    assert sorted(kind.name for kind in declared) == sorted(type_names())
    assert set(declared) == set(TYPES)
    assert type_names() == list(TABLES)  # the order the errors list them in
    assert _config_models(DestinationBase) == {kind.config for kind in TYPES}


@pytest.mark.parametrize("name", list(TABLES))
async def test_every_type_parses_and_builds_from_its_table(name: str) -> None:
    config = parse_destination_config({"type": name, **TABLES[name]})
    kind = next(kind for kind in TYPES if kind.name == name)
    assert type(config) is kind.config
    destination = build_destination("d", config)  # connects to nothing until started
    try:
        assert isinstance(destination, Destination)
        assert destination.name == "d"
    finally:
        await destination.aclose()


def test_a_model_whose_type_is_not_its_name_is_refused() -> None:
    class Other(DestinationBase):
        type: Literal["other"]

    with pytest.raises(TypeError, match=r"Other.type must be Literal\['smtp'\]"):
        DestinationType("smtp", Other, lambda name, config, client: None)  # type: ignore[arg-type,return-value]

    class Unregistered(DestinationBase):
        type: Literal["unregistered"]

    with pytest.raises(TypeError, match="unknown destination config: Unregistered"):
        build_destination("d", Unregistered(type="unregistered"))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            'type = "kafka"\nurl = "kafka://h"',
            "destinations.bus: Value error, type 'kafka' is not a destination type (known: "
            "http, redis-stream, arq, amqp, nats, mqtt)",
        ),
        (
            'url = "https://a.b/"',
            "destinations.bus: Value error, type is missing: one of http, redis-stream, arq, "
            "amqp, nats, mqtt",
        ),
    ],
)
def test_settings_refuse_an_unknown_type_naming_the_known_ones(
    tmp_path: Path, table: str, message: str
) -> None:
    path = tmp_path / "relay.toml"
    path.write_text(f"[destinations.bus]\n{table}\n", encoding="utf-8")
    with pytest.raises(SettingsError) as refused:
        load_settings(path)
    assert message in str(refused.value)


def _loaded_clients(code: str) -> set[str]:
    """The broker clients a fresh interpreter has loaded after running ``code``."""
    clients = sorted(CLIENTS.values())
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {clients!r} if m in sys.modules))"
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(found.stdout.split())


def test_importing_and_configuring_destinations_loads_no_broker_client() -> None:
    tables = {name: {"type": name, **table} for name, table in TABLES.items()}
    code = (
        "import relay.destinations, relay.settings\n"
        f"for table in {list(tables.values())!r}:\n"
        "    relay.destinations.parse_destination_config(table)"
    )
    assert _loaded_clients(code) == set()


@pytest.mark.parametrize("name", list(CLIENTS))
def test_building_a_broker_destination_loads_its_client_alone(name: str) -> None:
    table = {"type": name, **TABLES[name]}
    code = (
        "import asyncio\n"
        "from relay.destinations import build_destination, parse_destination_config\n"
        "async def build():\n"
        f"    await build_destination('d', parse_destination_config({table!r})).aclose()\n"
        "asyncio.run(build())"
    )
    assert _loaded_clients(code) == {CLIENTS[name]}
