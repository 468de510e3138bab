"""One sandbox: its settings, API key, clock, state and callback scheduler, in one object (no
global state). ``async with Sandbox(settings):`` runs its scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from types import TracebackType

import httpx

from relay.sandbox.bounded_clock import BoundedClock
from relay.sandbox.callbacks import MAX_IN_FLIGHT, Scheduler
from relay.sandbox.settings import API_CHAOS, CHAOS_NAMES, SandboxSettings
from relay.sandbox.state import State
from relay.simulator.clocks import Clock, ScaledClock


class Sandbox:
    """A fake of the platform's API: what the app sent, and the callbacks it is owed."""

    def __init__(
        self,
        settings: SandboxSettings | None = None,
        *,
        clock: Clock | None = None,
        base_url: str = "",
    ) -> None:
        self.settings = settings or SandboxSettings()
        given = self.settings.api_key
        self.api_key = given.get_secret_value() if given else secrets.token_urlsafe(24)
        self.clock: Clock = clock or BoundedClock(ScaledClock(self.settings.time_scale))
        self.base_url = base_url
        """The sandbox's own URL, for the ``href`` of its answers (set once it listens)."""
        self.state = State()
        self.rng = random.Random(self.settings.seed)
        self.client = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=MAX_IN_FLIGHT),
        )
        self.scheduler = Scheduler(self.state, self.clock, self.client, max_in_flight=MAX_IN_FLIGHT)
        self._runner: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sandbox:
        self._runner = asyncio.create_task(self.scheduler.run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self.scheduler.reset()
        await self.client.aclose()

    def draw_chaos(self, forced: frozenset[str], *, api: bool) -> frozenset[str]:
        """The chaos for one API request (``api``) or one message: the forced names plus the
        run's random draws."""
        names = API_CHAOS if api else frozenset(CHAOS_NAMES) - API_CHAOS
        drawn = {n for n in names if self.rng.random() < self.settings.chaos.rate(n)}
        return frozenset((forced & names) | drawn)

    def reset(self) -> None:
        """Forget every record and drop every pending callback."""
        self.scheduler.reset()
        self.state.clear()
