"""What the broker destinations (``amqp``, ``nats``, ``mqtt``) share: one attempt's shape.

An attempt renders the body and the headers (:mod:`relay.destinations.message_headers`) and the
name from the template (a routing key, a subject, a topic), then, within its timeout, takes the
connection (opened again if lost), publishes and waits for the broker's confirmation; every
failure becomes an :class:`Outcome`. ``start`` loads the TLS files, then connects within the
timeout, logging a broker it cannot use yet. Each broker module keeps its connection, message,
publish and the words of its errors; no client library is imported here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import ClassVar, Generic, TypeVar

from relay.destinations.broker_config import BrokerDestinationBase
from relay.destinations.errors import DestinationRefused, timeout_error
from relay.destinations.message_headers import MessageHeaders
from relay.destinations.outbound import Outbound, render
from relay.destinations.outcome import Outcome, elapsed_ms
from relay.destinations.templates import NameTemplate
from relay.destinations.tls_files import TlsContext, TlsFiles

Link = TypeVar("Link")
"""What a publish goes through: an AMQP exchange, a NATS link, an MQTT connection."""
Message = TypeVar("Message")
"""What the client publishes: an aio-pika message, a NATS body and headers, an MQTT body and
properties."""


class Undelivered(Exception):
    """An attempt that cannot succeed now; its text is the attempt's error, without secrets.
    ``down``: whether it says the broker cannot take any message now (no connection, no room),
    not only this one (see :attr:`Outcome.down`)."""

    def __init__(self, reason: str, *, down: bool = True) -> None:
        super().__init__(reason)
        self.down = down


class BrokerDestination(Generic[Link, Message]):
    """A broker destination's shared part; a subclass sets the class attributes and writes
    ``_ready``, ``_message``, ``_send``, ``_failure`` and ``aclose``."""

    CLIENT: ClassVar[str]
    """The client's protocol, in the error of an attempt the client cancelled under it."""
    CANCELLED_DOWN: ClassVar[bool] = True
    """Whether such a cancellation counts as the broker being down."""
    ERRORS: ClassVar[tuple[type[BaseException], ...]]
    """What the client raises for the broker's or the network's sake (see ``_failure``)."""
    NOT_YET: ClassVar[str]
    """``start``'s warning for a broker it cannot use yet (``%`` arguments: the destination's
    name, where it publishes, the problem)."""

    def __init__(
        self,
        name: str,
        config: BrokerDestinationBase,
        *,
        template: str,
        where: str,
        tls: TlsFiles | None,
    ) -> None:
        self.name = name
        self._where = where
        """The broker's address, without credentials, for the logs."""
        self._template = NameTemplate(template)
        self._format = config.format
        self._headers = MessageHeaders([s.get_secret_value() for s in config.secret])
        self._start_timeout = config.timeout_seconds
        self._tls = TlsContext(tls)
        self._lock = asyncio.Lock()
        """Held while the connection is taken, opened or closed."""
        self._log = logging.getLogger(type(self).__module__)

    def name_for(self, outbound: Outbound) -> str:
        """The routing key, subject or topic ``outbound`` is published to."""
        return self._template.render(outbound)

    def message_for(self, outbound: Outbound) -> Message:
        """What is published for ``outbound``: its body and headers, in the client's form."""
        body, content_type = render(outbound, self._format)
        headers = self._headers.for_message(outbound, body, content_type)
        return self._message(outbound, body, content_type, headers)

    async def start(self) -> None:
        """Load the TLS files (one that cannot be used raises :class:`DestinationRefused`
        naming it), then connect and check, within the destination's timeout. A broker that is
        down or refuses is not an error here (its deliveries fail and wait under the policy):
        it is logged, without credentials, and the first delivery tries again."""
        self._tls.load()
        try:
            async with asyncio.timeout(self._start_timeout):
                await self._check()
        except TimeoutError:
            problem = timeout_error(self._start_timeout)
        except DestinationRefused:
            await self.aclose()
            raise
        except Undelivered as exc:
            problem = str(exc)
        except self.ERRORS as exc:
            problem = self._failure(exc)[0]
        else:
            return
        self._log.warning(self.NOT_YET, self.name, self._where, problem)

    async def deliver(self, outbound: Outbound, *, timeout: float) -> Outcome:
        """Publish once and wait for the broker's confirmation; never raises for connection
        or broker errors."""
        started = time.perf_counter()
        message = self.message_for(outbound)
        name = self.name_for(outbound)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                await self._send(await self._ready(timeout), name, message, deadline)
        except TimeoutError:
            error, down = self._timeout_error(timeout), True
        except Undelivered as exc:
            error, down = str(exc), exc.down
        except asyncio.CancelledError:
            # a library future cancelled under us (not this task): a failed attempt
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            error = f"cancelled by the {self.CLIENT} client (connection closing?)"
            down = self.CANCELLED_DOWN
        except self.ERRORS as exc:
            error, down = self._failure(exc)
        else:
            return Outcome(ok=True, duration_ms=elapsed_ms(started))
        return Outcome(ok=False, error=error, duration_ms=elapsed_ms(started), down=down)

    async def _check(self) -> None:
        """What ``start`` does within its timeout: connect."""
        await self._ready(self._start_timeout)

    async def aclose(self) -> None:
        """Close the connection."""
        raise NotImplementedError

    async def _ready(self, timeout: float) -> Link:
        """The connection, opened again if lost (``timeout``: the attempt's)."""
        raise NotImplementedError

    def _message(
        self, outbound: Outbound, body: bytes, content_type: str | None, headers: dict[str, str]
    ) -> Message:
        """The client's message for ``body`` with the relay's ``headers``."""
        raise NotImplementedError

    async def _send(self, link: Link, name: str, message: Message, deadline: float) -> None:
        """Publish to ``name``, wait for the confirmation until ``deadline`` (the loop's
        clock); raise :class:`Undelivered` or one of ``ERRORS`` without it."""
        raise NotImplementedError

    def _failure(self, exc: BaseException) -> tuple[str, bool]:
        """The error of an attempt failed with one of ``ERRORS``; whether the broker is down."""
        raise NotImplementedError

    def _timeout_error(self, timeout: float) -> str:
        """The error of an attempt that ran out of time."""
        return timeout_error(timeout)
