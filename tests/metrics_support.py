"""Reading a Prometheus exposition in tests, with ``prometheus_client``'s own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample(exposition: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` with exactly these labels, or None when absent."""
    for family in text_string_to_metric_families(exposition):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    return None
