"""pytest plugin (entry point ``pytest11``): the ``platform`` and ``platform_api`` fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from relay.simulator.testing import PlatformSimulator

if TYPE_CHECKING:
    from relay.sandbox.testing import PlatformApi


@pytest.fixture
def platform() -> PlatformSimulator:
    """The CPaaS platform, ready to call your webhook handler: ``platform.target(app)``."""
    return PlatformSimulator(seed=0)


@pytest.fixture
def platform_api() -> Iterator[PlatformApi]:
    """The platform's API in a box (``relay sandbox``) on 127.0.0.1, for the app under test:
    ``base_url``, ``api_key``, ``messages``, ``wait_for(...)``, ``callbacks``, and a clock
    that moves with ``advance(...)``. Stopped after the test."""
    from relay.sandbox.testing import PlatformApi  # the sandbox loads only for tests using it

    api = PlatformApi()
    try:
        yield api
    finally:
        api.stop()
