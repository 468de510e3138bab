"""The console's one script (``static/live.js``, vendored: no CDN, no build step) and the hash
by which its Content-Security-Policy lets it run inline, and nothing else."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from markupsafe import Markup

LIVE_SCRIPT = (Path(__file__).parent / "static" / "live.js").read_text(encoding="utf-8")
"""The live counts of the events and deliveries pages (a page works without it)."""


def script_hash(text: str) -> str:
    """A CSP hash source for an inline script of exactly ``text``."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def live_script() -> Markup:
    """The script as a page embeds it: our own file, never escaped (its hash must match)."""
    if "</" in LIVE_SCRIPT:  # would end the script element early
        raise ValueError("static/live.js must not hold '</'")
    return Markup(LIVE_SCRIPT)
