"""The sandbox: a local fake of the platform's REST API that calls the app under test back.

One :class:`Sandbox` holds all of a sandbox's state; build it from :class:`SandboxSettings`
(and a clock: the simulator's ``ScaledClock`` by default, a ``VirtualClock`` or a
:class:`SteppedClock` in tests), serve :func:`build_app` (its lifespan runs the scheduler), and
read :attr:`Sandbox.state`. A product adds its callbacks with ``sandbox.scheduler.schedule(
Callback(...))`` and its timed steps with ``sandbox.scheduler.at(when, action)``.
"""

from relay.sandbox.app import build_app
from relay.sandbox.callbacks import Scheduler
from relay.sandbox.numbers import NUMBERS, MagicNumber
from relay.sandbox.sandbox import Sandbox
from relay.sandbox.settings import ChaosSettings, SandboxSettings
from relay.sandbox.state import Callback, CallbackAttempt, Message, State
from relay.sandbox.stepped_clock import SteppedClock

__all__ = [
    "NUMBERS",
    "Callback",
    "CallbackAttempt",
    "ChaosSettings",
    "MagicNumber",
    "Message",
    "Sandbox",
    "SandboxSettings",
    "Scheduler",
    "State",
    "SteppedClock",
    "build_app",
]
