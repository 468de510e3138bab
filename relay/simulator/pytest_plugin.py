"""pytest plugin (entry point ``pytest11``): the ``platform`` fixture."""

from __future__ import annotations

import pytest

from relay.simulator.testing import PlatformSimulator


@pytest.fixture
def platform() -> PlatformSimulator:
    """The CPaaS platform, ready to call your webhook handler: ``platform.target(app)``."""
    return PlatformSimulator(seed=0)
