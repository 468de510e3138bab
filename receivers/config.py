"""What the receiver app is built from."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_network

from receivers.kinds import RESERVED_SOURCE_NAMES
from receivers.sources import Network, SourceConfig, check_not_everyone

DEFAULT_SOURCE = "default"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
SOURCE_NAME_LENGTH = 64
"""The longest source name (the width of the store's ``source`` columns)."""


@dataclass(frozen=True)
class ReceiverConfig:
    """Sources and limits of one receiver app (``trusted_proxies`` may be given as CIDR text)."""

    sources: Mapping[str, SourceConfig]
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    trusted_proxies: Sequence[Network] = field(default_factory=tuple)
    writer_process: bool = True
    """Whether a SQLite file's events are written by a process of their own
    (:mod:`receivers.store.writer_process`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.writer_process, bool):
            raise ValueError(f"writer_process must be true or false, not {self.writer_process!r}")
        networks = tuple(
            ip_network(n, strict=False) if isinstance(n, str) else n for n in self.trusted_proxies
        )
        check_not_everyone(networks, "trusted_proxies")
        object.__setattr__(self, "trusted_proxies", networks)
        if not self.sources:
            raise ValueError("no source is configured")
        for name in self.sources:
            check_source_name(name)


UNSHOWABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Unicode categories a name may not hold: controls (PostgreSQL's text refuses NUL), format
characters (a right-to-left override would spoof lists and logs), unpaired surrogates (not
UTF-8: no store holds them), private and unassigned code points, line and paragraph separators."""


def check_storable_name(what: str, name: str) -> None:
    """ValueError unless ``name`` can name a thing in the store, the CLI and the logs: not
    blank, and no character of :data:`UNSHOWABLE`."""
    if not name.strip():
        raise ValueError(f"{what} name cannot be empty or blank")
    if any(unicodedata.category(c) in UNSHOWABLE for c in name):
        raise ValueError(
            f"{what} name {name!r} holds a control, format or unassigned character, or an "
            "unpaired surrogate"
        )


def check_source_name(name: str) -> None:
    """ValueError unless ``name`` can name a source: a URL path segment that no receiver path
    takes, at most :data:`SOURCE_NAME_LENGTH` characters, that the store can hold."""
    check_storable_name("source", name)
    if name in RESERVED_SOURCE_NAMES:
        raise ValueError(f"source name {name!r} is taken by a receiver path")
    if not name or name != name.strip() or name in (".", "..") or any(c in name for c in "/?#"):
        raise ValueError(f"source name {name!r} is not a path segment")
    if len(name) > SOURCE_NAME_LENGTH:
        raise ValueError(
            f"source name {name[:16]!r}... is longer than {SOURCE_NAME_LENGTH} characters"
        )


def source_prefix(name: str) -> str:
    """The URL prefix of a source's receivers."""
    return "/hooks" if name == DEFAULT_SOURCE else f"/hooks/{name}"
