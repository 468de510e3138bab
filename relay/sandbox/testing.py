"""The ``platform_api`` pytest fixture's object: a sandbox served on 127.0.0.1 (a free port)
from a thread of its own, on a clock that moves only when the test says so.

The thread holds the sandbox's event loop, so the fixture works the same in sync and async
tests: the app under test talks to :attr:`PlatformApi.base_url` over HTTP, the test moves time
with :meth:`PlatformApi.advance` (the schedule then runs in milliseconds) and reads what the
sandbox saw. Every method has an ``_async`` twin for async tests (the sync ones block).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import socket
import threading
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

import uvicorn

from relay.sandbox import control, lookups, tts
from relay.sandbox.app import build_app
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.settings import SandboxSettings
from relay.sandbox.stepped_clock import SteppedClock

T = TypeVar("T")
START_SECONDS = 30.0
WAIT_SECONDS = 10.0


class PlatformApi:
    """A running sandbox for one test; :meth:`stop` ends it (the fixture does)."""

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self._settings = settings or SandboxSettings()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: uvicorn.Server | None = None
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        """Where the app under test sends its API requests."""
        self.clock = SteppedClock()
        """The sandbox's clock: it stands still until :meth:`advance`."""
        self.sandbox = Sandbox(self._settings, clock=self.clock, base_url=self.base_url)
        self.api_key = self.sandbox.api_key
        """The key for the ``apikey`` header."""
        self._thread = threading.Thread(target=self._serve, name="platform-api", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_SECONDS):
            raise RuntimeError("the sandbox did not start")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        config = uvicorn.Config(
            build_app(self.sandbox), log_level="warning", lifespan="on", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._loop.run_until_complete(self._run(self._server))

    async def _run(self, server: uvicorn.Server) -> None:
        task = asyncio.create_task(server.serve(sockets=[self._sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        self._ready.set()
        await task

    def _call(
        self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float, what: str = "the call"
    ) -> T:
        """Run ``make()`` in the sandbox's loop; past ``timeout`` seconds it is cancelled and
        the test fails saying what did not finish (never a bare timeout, nor a task left
        running into the next test)."""
        future = asyncio.run_coroutine_threadsafe(make(), self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise AssertionError(f"{what} did not finish within {timeout:g} s") from None

    async def _call_async(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), self._loop))

    # --- time ----------------------------------------------------------------------------

    def now(self) -> datetime:
        """The sandbox's time."""
        return self.clock.now()

    def advance(self, delta: timedelta | float, *, timeout: float = WAIT_SECONDS) -> None:
        """Move time forward (a timedelta or seconds) and return once every callback due by
        then was sent and answered. A receiver that never answers holds each attempt for the
        callbacks' answer timeout (10 s, real time): past ``timeout`` real seconds the test
        fails naming the callbacks still being sent."""
        step = _step(delta)
        _check_timeout(timeout)
        self._call(lambda: self._advance(step), timeout, self._unsettled_what(step))

    async def advance_async(self, delta: timedelta | float) -> None:
        step = _step(delta)
        await self._call_async(lambda: self._advance(step))

    def _unsettled_what(self, step: timedelta) -> str:
        return (
            f"advance({step}): the callbacks due (a receiver that does not answer holds each "
            "attempt for 10 s; see platform_api.callbacks, or pass a longer timeout=)"
        )

    async def _advance(self, step: timedelta) -> None:
        await self.sandbox.scheduler.idle()
        self.clock.advance(step)
        await asyncio.sleep(0)  # the scheduler wakes and takes what is due
        await self.sandbox.scheduler.idle()

    # --- what the sandbox saw --------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Every SMS sent, as the control API lists them (with their callbacks)."""
        return self._call(self._messages, WAIT_SECONDS)

    async def _messages(self) -> list[dict[str, Any]]:
        return [control.message_json(self.sandbox, m) for m in self.sandbox.state.messages.values()]

    @property
    def lookups(self) -> list[dict[str, Any]]:
        """Every GNP and GNV request, with its result and callbacks."""

        async def read() -> list[dict[str, Any]]:
            state = self.sandbox.state
            return [lookups.lookup_json(self.sandbox, r) for r in state.lookups.values()]

        return self._call(read, WAIT_SECONDS)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every text-to-speech call, with its events and callbacks."""

        async def read() -> list[dict[str, Any]]:
            return [tts.call_json(self.sandbox, c) for c in self.sandbox.state.calls.values()]

        return self._call(read, WAIT_SECONDS)

    @property
    def callbacks(self) -> list[dict[str, Any]]:
        """Every callback the sandbox made or plans, each with its attempts and answers."""

        async def read() -> list[dict[str, Any]]:
            return [c.as_json() for c in self.sandbox.state.callbacks.values()]

        return self._call(read, WAIT_SECONDS)

    def wait_for(
        self,
        *,
        to: str | None = None,
        text: str | None = None,
        status: str | None = None,
        timeout: float = WAIT_SECONDS,
    ) -> dict[str, Any]:
        """The first SMS sent to ``to``, holding ``text``, in ``status`` (each optional), once
        there is one (real time: the app may send from another thread); AssertionError after
        ``timeout`` seconds. Time on the clock does not move meanwhile: :meth:`advance`."""
        _check_timeout(timeout)
        return self._call(lambda: self._wait_for(to, text, status, timeout), timeout + 5)

    async def wait_for_async(
        self,
        *,
        to: str | None = None,
        text: str | None = None,
        status: str | None = None,
        timeout: float = WAIT_SECONDS,
    ) -> dict[str, Any]:
        _check_timeout(timeout)
        return await self._call_async(lambda: self._wait_for(to, text, status, timeout))

    async def _wait_for(
        self, to: str | None, text: str | None, status: str | None, timeout: float
    ) -> dict[str, Any]:
        wanted = {k: v for k, v in (("to", to), ("text", text), ("status", status)) if v}
        state = self.sandbox.state
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for message in state.messages.values():
                if _matches(message, wanted):
                    return control.message_json(self.sandbox, message)
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"no SMS matched {wanted} within {timeout:g} s")
            await state.wait_for_change(left)

    def reset(self) -> None:
        """Forget every record and pending callback."""

        async def reset() -> None:
            self.sandbox.reset()

        self._call(reset, WAIT_SECONDS)

    def stop(self) -> None:
        """Stop serving (pending callbacks are dropped) and end the thread."""
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(START_SECONDS)
        self._sock.close()
        if not self._thread.is_alive():
            self._loop.close()


def _matches(message: Any, wanted: dict[str, str]) -> bool:
    return (
        wanted.get("to", message.to) == message.to
        and wanted.get("text", "") in message.text
        and wanted.get("status", message.status).upper() == message.status
    )


MAX_TIMEOUT_SECONDS = 3600.0


def _step(delta: timedelta | float) -> timedelta:
    """``delta`` as a forward step of time: a timedelta or a number of seconds (not a bool),
    zero or more."""
    if isinstance(delta, bool) or not isinstance(delta, timedelta | int | float):
        raise TypeError(f"advance() takes a timedelta or seconds, not {delta!r}")
    if not isinstance(delta, timedelta):
        if not math.isfinite(delta):
            raise ValueError(f"advance() takes a finite number of seconds, not {delta!r}")
        delta = timedelta(seconds=delta)
    if delta < timedelta(0):
        raise ValueError(f"time only moves forward: advance({delta})")
    return delta


def _check_timeout(timeout: float) -> None:
    """A real-time bound the fixture can wait: a number from 0 to an hour."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout is a number of seconds, not {timeout!r}")
    if not 0 <= timeout <= MAX_TIMEOUT_SECONDS:
        raise ValueError(f"timeout must be 0 to {MAX_TIMEOUT_SECONDS:g} seconds, not {timeout!r}")
