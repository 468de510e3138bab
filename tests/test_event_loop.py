"""The event loop of `relay serve`, `relay worker` and the event writer process: uvloop by
default where it is installed, asyncio's own with ``--loop asyncio`` (or ``RELAY_LOOP``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import uvloop
from click.testing import CliRunner
from redis.asyncio import Redis

from receivers.event_loop import loop_factory, loop_name
from receivers.store import utc_now
from receivers.store.writer_process import ProcessLane
from relay.cli import main
from tests.conftest import REDIS_URL, TOKEN
from tests.store_support import child_environment

STOP_TIMEOUT_S = 15
START_TIMEOUT_S = 30.0


@pytest.mark.parametrize(
    ("name", "kind"), [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")]
)
def test_each_name_makes_its_kind_of_loop(name: str, kind: str) -> None:
    loop = loop_factory(name)()  # type: ignore[arg-type]
    try:
        assert loop_name(loop) == kind
        assert isinstance(loop, uvloop.Loop) == (kind == "uvloop")
    finally:
        loop.close()


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--loop", "tokio"], {}),
        (["--loop", ""], {}),
        (["--loop", "UVLOOP "], {}),
        (["--loop", "asyncio\x00"], {}),
        ([], {"RELAY_LOOP": "trio"}),
    ],
)
def test_an_unknown_loop_is_refused_before_start(
    command: str, args: list[str], env: Mapping[str, str]
) -> None:
    result = CliRunner().invoke(main, [command, *args], env=dict(env))
    assert result.exit_code == 2
    assert "Invalid value for '--loop'" in result.output


def test_the_loop_option_is_documented() -> None:
    for command in ("serve", "worker"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert "--loop [auto|asyncio|uvloop]" in result.output
        assert "$RELAY_LOOP" in result.output


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_the_writer_process_runs_on_its_servers_kind_of_loop(tmp_path: Path, kind: str) -> None:
    async def children() -> list[list[str]]:
        lane = ProcessLane(str(tmp_path / "relay.db"), clock=utc_now, on_stored=lambda _: None)
        await lane.start()
        try:
            return [
                argv
                for argv in map(command_line, child_pids())
                if "receivers.store.writer_process" in argv
            ]
        finally:
            await lane.close()

    [argv] = asyncio.Runner(loop_factory=loop_factory(kind)).run(children())  # type: ignore[arg-type]
    assert argv[-2:] == [str(tmp_path / "relay.db"), kind]


@pytest.mark.parametrize(
    "argv", [["relay.db"], ["relay.db", "auto"], ["relay.db", ""], ["relay.db", "uvloop", "x"]]
)
def test_the_writer_process_refuses_a_command_line_without_its_loop(argv: list[str]) -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "receivers.store.writer_process", *argv],
        env=child_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert finished.returncode == 2
    assert "usage: python -m receivers.store.writer_process DATABASE asyncio|uvloop" in (
        finished.stderr
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "kind"),
    [
        ([], {}, "uvloop"),
        ([], {"RELAY_LOOP": ""}, "uvloop"),  # empty: not set (as for every option's variable)
        (["--loop", "asyncio"], {"RELAY_LOOP": "uvloop"}, "asyncio"),
        ([], {"RELAY_LOOP": "asyncio"}, "asyncio"),
    ],
)
async def test_relay_worker_says_which_loop_it_runs_on(
    tmp_path: Path, redis: Redis, args: list[str], env: Mapping[str, str], kind: str
) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "relay.db"}"\nredis_url = "{REDIS_URL}"\n'
        f'[sources.default]\ntoken = "{TOKEN}"\n'
        '[destinations.crm]\ntype = "http"\nurl = "http://127.0.0.1:9/hook"\n'
    )
    for command in (["db", "upgrade"], ["worker", *args]):
        environment = {
            k: v for k, v in child_environment().items() if not k.startswith("RELAY_")
        } | dict(env)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "relay",
            *command,
            "--config",
            str(config),
            env=environment,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stderr is not None
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                if command[0] == "db":
                    assert await process.wait() == 0
                    continue
                while b"relay worker started" not in (line := await process.stderr.readline()):
                    assert line, "the worker ended before it started"
        finally:
            if process.returncode is None:
                await stopped_by_sigterm(process)
    assert line.decode().rstrip().endswith(f"; event loop {kind}")


async def stopped_by_sigterm(process: asyncio.subprocess.Process) -> None:
    """SIGTERM stops it within :data:`STOP_TIMEOUT_S` (reading what it still logs: a full pipe
    would block it); else it is killed and the test fails."""
    process.terminate()
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await process.communicate()
    except TimeoutError:
        process.kill()
        await process.communicate()
        raise AssertionError(f"still running {STOP_TIMEOUT_S} s after SIGTERM") from None


def child_pids() -> list[int]:
    """The processes this one started (from /proc)."""
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                pids.append(int(entry.name))
    return pids


def command_line(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []
