"""Whether a broker destination's client library is installed: the brokers' clients are the
optional ``callback-relay[brokers]`` extra, so that an install that only needs HTTP, Redis or
arq destinations goes without them. A broker destination configured without its client is a
configuration error that names the extra, found when the settings are read (so at the start of
every command), instead of an ImportError when the destination is built."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.util import find_spec

BROKERS_INSTALL = "pip install 'callback-relay[brokers]'"
"""What installs every broker's client."""


def installed(module: str) -> bool:
    """Whether the top-level ``module`` can be imported, found without importing it."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):  # refused by an import hook, or a module without a spec
        return False


def require_client(type_name: str, package: str, modules: Sequence[str]) -> None:
    """Raise :class:`ValueError` naming the extra unless all of ``modules`` (the top-level
    modules of ``package`` and of what the destination imports beside it) are installed."""
    missing = [module for module in modules if not installed(module)]
    if missing:
        raise ValueError(
            f"{type_name} destinations need {package}, which is not installed "
            f"(no module {', '.join(missing)}): {BROKERS_INSTALL}"
        )
