"""Test support: a real HTTP sink served by uvicorn, and free ports on 127.0.0.1."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (right now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM a server the test started and wait for it; SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pause_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGSTOP a server the test started and return once every one of its threads has stopped.

    The signal is asynchronous: a thread busy on another core may still answer a request sent
    right after ``send_signal`` returns, unless the test waits for the ``T`` state in /proc.
    """
    process.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{process.pid}/task")
    deadline = time.monotonic() + timeout
    while not all(_stopped(task) for task in tasks.iterdir()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {process.pid} did not stop within {timeout}s")
        time.sleep(0.005)


def _stopped(task: Path) -> bool:
    try:
        stat = (task / "stat").read_text()
    except FileNotFoundError:  # the thread has exited
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"T", "t"}


@dataclass
class Answer:
    """How the sink answers a path."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"thanks"
    delay: float = 0.0


@dataclass
class Recorded:
    """One request the sink received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: str = ""
    """The client's address and port: one per connection."""
    query: str = ""
    """The raw query string."""


class Sink:
    """Records requests; answers per path as configured (200 "thanks" by default).
    ``script`` lists answers to give, in order, before falling back to ``answers``."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.answers: dict[str, Answer] = {}
        self.script: dict[str, list[Answer]] = {}
        self.base_url = ""
        self.app = Starlette(
            routes=[Route("/{path:path}", self._endpoint, methods=["GET", "POST", "PUT"])]
        )

    def url(self, path: str = "/hook") -> str:
        return self.base_url + path

    def bodies(self, path: str = "/hook") -> list[bytes]:
        return [r.body for r in self.requests if r.path == path]

    async def _endpoint(self, request: Request) -> Response:
        body = await request.body()
        self.requests.append(
            Recorded(
                request.method,
                request.url.path,
                dict(request.headers),
                body,
                f"{request.client.host}:{request.client.port}" if request.client else "",
                request.url.query,
            )
        )
        scripted = self.script.get(request.url.path)
        answer = scripted.pop(0) if scripted else self.answers.get(request.url.path, Answer())
        if answer.delay:
            await asyncio.sleep(answer.delay)
        return Response(answer.body, status_code=answer.status, headers=answer.headers)


@asynccontextmanager
async def serving(sink: Sink) -> AsyncIterator[Sink]:
    """Serve the sink with uvicorn on a free port of 127.0.0.1 in this event loop."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sink.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(
        sink.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield sink
    finally:
        server.should_exit = True
        await task
        sock.close()
