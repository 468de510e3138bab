"""A destination's last hour as a small SVG bar chart, drawn on the server (no script).

Each five-minute bucket is a bar as tall as its attempts, its succeeded part in one colour
and its failed part in another; the mean latency is a line through a marker on each bucket
that has attempts (a lone bucket is then still a visible point, not a line of no length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay.console.queries import HealthBucket
from relay.console.wording import count_text

WIDTH = 240
HEIGHT = 48
GAP = 2


@dataclass(frozen=True)
class Bar:
    """One bucket's shapes, in SVG user units."""

    x: float
    width: float
    ok_y: float
    ok_height: float
    failed_y: float
    failed_height: float
    latency_y: float | None
    title: str

    @property
    def middle(self) -> float:
        """The bar's centre, where its latency marker sits."""
        return self.x + self.width / 2


def health_chart(buckets: Sequence[HealthBucket]) -> list[Bar]:
    """The bars of a chart of ``buckets`` (empty without any attempt)."""
    if not any(bucket.attempts for bucket in buckets):
        return []
    most = max(bucket.attempts for bucket in buckets)
    slowest = max((bucket.mean_ms or 0.0) for bucket in buckets) or 1.0
    width = WIDTH / len(buckets)
    bars = []
    for index, bucket in enumerate(buckets):
        ok = HEIGHT * bucket.succeeded / most
        failed = HEIGHT * (bucket.attempts - bucket.succeeded) / most
        latency = None if bucket.mean_ms is None else HEIGHT - HEIGHT * bucket.mean_ms / slowest
        mean = "-" if bucket.mean_ms is None else f"{bucket.mean_ms:.0f} ms"
        bars.append(
            Bar(
                x=index * width,
                width=width - GAP,
                ok_y=HEIGHT - ok,
                ok_height=ok,
                failed_y=HEIGHT - ok - failed,
                failed_height=failed,
                latency_y=latency,
                title=(
                    f"{bucket.start:%H:%M} UTC: {count_text(bucket.attempts, 'attempt')}, "
                    f"{bucket.succeeded} succeeded, mean {mean}"
                ),
            )
        )
    return bars


def latency_line(bars: Sequence[Bar]) -> str:
    """The SVG ``points`` of the line through the latency markers ("" without any)."""
    return " ".join(
        f"{bar.middle:g},{bar.latency_y:g}" for bar in bars if bar.latency_y is not None
    )
