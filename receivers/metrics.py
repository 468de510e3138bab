"""In-process counters of what the receivers saw, rendered in Prometheus text format."""

from __future__ import annotations

from collections import Counter

LabelSet = tuple[tuple[str, str], ...]
CounterKey = tuple[str, LabelSet]


class Counters:
    """Monotonic counters keyed by name and labels; one instance per app."""

    def __init__(self) -> None:
        self._values: Counter[CounterKey] = Counter()

    @staticmethod
    def key(name: str, **labels: str) -> CounterKey:
        """The key of one counter, for :meth:`add` on hot paths."""
        return (name, tuple(sorted(labels.items())))

    def add(self, key: CounterKey, amount: int = 1) -> None:
        """Add ``amount`` to the counter with this key."""
        self._values[key] += amount

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        """Add ``amount`` to the counter ``name`` with these labels."""
        self._values[self.key(name, **labels)] += amount

    def get(self, name: str, **labels: str) -> int:
        """The current value of one counter."""
        return self._values[self.key(name, **labels)]

    def render(self) -> str:
        """All counters in Prometheus exposition format."""
        lines: list[str] = []
        for name in sorted({name for name, _ in self._values}):
            lines.append(f"# TYPE {name} counter")
            for (metric, labels), value in sorted(self._values.items()):
                if metric != name:
                    continue
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{name}{{{rendered}}} {value}" if rendered else f"{name} {value}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
