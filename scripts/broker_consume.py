"""The broker's own consumer in a process of its own, for the benchmark and the chaos run.

Runs ``broker_<KIT>.consume(url, name, count, idle_timeout)`` and writes what it received to
OUT as JSON: ``[[webhook_id, arrival_time], ...]`` (duplicates included). A consumer in its own
process takes no CPU from the process that publishes (the baseline) or that drives the load::

    python scripts/broker_consume.py amqp URL NAME COUNT IDLE_TIMEOUT OUT
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    kit_name, url, name, count, idle_timeout, out = argv
    kit = importlib.import_module(f"broker_{kit_name}")
    received = asyncio.run(kit.consume(url, name, int(count), float(idle_timeout)))
    partial = Path(out).with_suffix(".partial")
    partial.write_text(json.dumps(received), encoding="utf-8")
    partial.replace(out)  # readers never see half a file
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
