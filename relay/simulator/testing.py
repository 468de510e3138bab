"""The platform as a test double for your own webhook handler (the `platform` pytest fixture).

    def test_stop_is_handled(platform, my_app):
        platform.target(my_app, token="t")
        result = platform.sms_inbound(message="STOP")
        assert result.answers == [200]

Time is virtual: a retry schedule is walked without waiting. Inside ``freeze_time(...) as
frozen``, pass ``platform.follow(frozen)`` so that your app sees the clock move with the retries.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Mapping
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx

from relay.delivery.breaker import DestinationHealth
from relay.simulator import factories
from relay.simulator.clocks import Clock, VirtualClock
from relay.simulator.platform import CallbackResult, Platform
from relay.simulator.run import RunOptions, plan, run_units
from relay.simulator.scenarios import SCENARIOS, Callback
from relay.simulator.wire import Credentials, Endpoint

T = TypeVar("T")
IN_PROCESS_BASE = "http://platform.test"


class PlatformSimulator:
    """Sends the platform's callbacks to one target: an ASGI app in-process, or a URL."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.retry = True
        self.duplicate_rate = 0.0
        self.clock: Clock = VirtualClock()
        self._endpoint: Endpoint | None = None
        self._transport: Callable[[], httpx.AsyncBaseTransport | None] = lambda: None
        self._credentials = Credentials()
        self._method = "POST"
        self._health = DestinationHealth()

    def target(
        self,
        app_or_url: Any,
        *,
        token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        secret: str | None = None,
        signature_method: str = "HS256",
        header: tuple[str, str] | None = None,
        prefix: str = "/hooks",
        method: str = "POST",
        exact: bool = False,
        client_ip: str = "127.0.0.1",
    ) -> None:
        """Aim at an ASGI app (in-process, httpx ASGITransport) or a base URL; the kind's path
        is appended to it unless ``exact``. Credentials as configured on the platform."""
        query = "?" + urlencode({"token": token}) if token else ""
        if isinstance(app_or_url, str):
            endpoint = Endpoint.parse(app_or_url, exact=exact)
            self._transport = lambda: None
            if token:
                endpoint = Endpoint(
                    endpoint.base, (*endpoint.query, ("token", token)), endpoint.basic_auth, exact
                )
        else:
            endpoint = Endpoint.parse(IN_PROCESS_BASE + prefix + query, exact=exact)
            self._transport = lambda: httpx.ASGITransport(app=app_or_url, client=(client_ip, 40000))
        if basic_auth is not None:
            endpoint = Endpoint(endpoint.base, endpoint.query, basic_auth, exact)
        self._endpoint = endpoint
        self._credentials = Credentials(secret, signature_method, header)
        self._method = method

    def follow(self, frozen: Any) -> None:
        """Move a freezegun clock (``freeze_time(...) as frozen``) along with the retries."""
        self.clock = VirtualClock(tick=lambda step: frozen.tick(step))

    # --- one callback of each kind -------------------------------------------------------------

    def sms_inbound(
        self, overrides: Mapping[str, Any] | None = None, **fields: Any
    ) -> CallbackResult:
        """An InboundMessage (``message="STOP"``; ``parts=3`` for a concatenated one)."""
        options = _pop(fields, "parts", "missing_part")
        body = factories.sms_inbound({**(overrides or {}), **fields}, rng=self.rng, **options)
        return self.send(Callback("sms.inbound", body, "inbound"))

    def sms_dlr(
        self,
        overrides: Mapping[str, Any] | None = None,
        *,
        status: str = "DELIVERED",
        **fields: Any,
    ) -> CallbackResult:
        """A delivery report with this status."""
        options = _pop(fields, "parts")
        body = factories.sms_dlr(
            {**(overrides or {}), **fields}, status=status, rng=self.rng, **options
        )
        return self.send(Callback("sms.dlr", body, status))

    def sms_dlr_legacy(
        self,
        overrides: Mapping[str, Any] | None = None,
        *,
        stat: str = "delivered",
        **fields: Any,
    ) -> CallbackResult:
        """A delivery report of the older SMS interface (``msgid``, ``stat``, ...); target with
        ``method="GET"`` to send it as query parameters, as that interface does."""
        body = factories.sms_dlr_legacy({**(overrides or {}), **fields}, stat=stat, rng=self.rng)
        return self.send(Callback("sms.dlr", body, stat))

    def numinfo_gnp(
        self, overrides: Mapping[str, Any] | None = None, **fields: Any
    ) -> CallbackResult:
        """A portability check result."""
        body = factories.numinfo_gnp({**(overrides or {}), **fields}, rng=self.rng)
        return self.send(Callback("numinfo.gnp", body, "result"))

    def numinfo_gnv(
        self, overrides: Mapping[str, Any] | None = None, **fields: Any
    ) -> CallbackResult:
        """An HLR lookup result."""
        body = factories.numinfo_gnv({**(overrides or {}), **fields}, rng=self.rng)
        return self.send(Callback("numinfo.gnv", body, "result"))

    def conversations_status(
        self,
        overrides: Mapping[str, Any] | None = None,
        *,
        event: str = "MessageStatus::delivered",
        channel: str = "appa",
        **fields: Any,
    ) -> CallbackResult:
        """A MessageStatus event."""
        body = factories.conversations_status(
            {**(overrides or {}), **fields}, event=event, channel=channel, rng=self.rng
        )
        return self.send(Callback("conversations.status", body, event))

    def conversations_inbound(
        self,
        overrides: Mapping[str, Any] | None = None,
        *,
        kind: str = "text",
        channel: str | None = None,
        **fields: Any,
    ) -> CallbackResult:
        """A MoMessage (``kind``: text, media, postback, order, sms, ...)."""
        body = factories.conversations_inbound(
            {**(overrides or {}), **fields}, kind=kind, channel=channel, rng=self.rng
        )
        return self.send(Callback("conversations.inbound", body, kind))

    def tts_event(
        self,
        overrides: Mapping[str, Any] | None = None,
        *,
        status: str = "completed",
        **fields: Any,
    ) -> CallbackResult:
        """A text-to-speech call event."""
        body = factories.tts_event({**(overrides or {}), **fields}, status=status, rng=self.rng)
        return self.send(Callback("tts.event", body, status))

    def scenario(
        self, name: str, count: int = 1, *, shuffle: bool = False, **overrides: Any
    ) -> list[CallbackResult]:
        """Every callback of ``count`` instances of a scenario (see `relay simulate list`)."""
        options = RunOptions(count=count, concurrency=1, shuffle=shuffle, overrides=overrides)
        units = plan(SCENARIOS[name], options, self.rng)
        return _run_sync(self._with_platform(lambda p: run_units(p, units, options)))

    # --- sending -------------------------------------------------------------------------------

    def send(self, callback: Callback) -> CallbackResult:
        """Deliver one callback like the platform (retries included); from sync tests."""
        return _run_sync(self.send_async(callback))

    async def send_async(self, callback: Callback) -> CallbackResult:
        """The same, from async tests."""
        return await self._with_platform(lambda platform: platform.deliver(callback))

    async def _with_platform(self, action: Callable[[Platform], Coroutine[Any, Any, T]]) -> T:
        if self._endpoint is None:
            raise RuntimeError("call platform.target(app_or_url, ...) first")
        async with httpx.AsyncClient(
            transport=self._transport(),
            follow_redirects=False,
            timeout=timedelta(seconds=10).total_seconds(),
        ) as client:
            platform = Platform(
                client,
                self._endpoint,
                clock=self.clock,
                credentials=self._credentials,
                method=self._method,
                retry=self.retry,
                duplicate_rate=self.duplicate_rate,
                rng=self.rng,
            )
            platform.health = self._health
            try:
                return await action(platform)
            finally:
                self._health = platform.health


def _pop(fields: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: fields.pop(name) for name in names if name in fields}


def _run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    coroutine.close()
    raise RuntimeError(
        "inside an async test, use `await platform.send_async(callback)` (build the callback "
        "with relay.simulator.scenarios.Callback and relay.simulator.factories)"
    )
