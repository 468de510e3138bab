#!/usr/bin/env bash
# The lower bounds of pyproject.toml, proven: installs the project with every direct dependency
# at its lower bound (constraints-lowest.txt) in a fresh virtual environment, and runs a
# selection of the suite there that covers the receivers, `relay serve` and `relay worker`, every
# destination type (the brokers' included), the migrations, the console and the pytest plugin.
# The machine's own environment is left as it is. The suite runs it
# (tests/test_lowest_versions.py, marked slow).
#
#   bash scripts/check_lowest.sh            # in $LOWEST_VENV (default: a new temporary directory)
#   bash scripts/check_lowest.sh -x -v      # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LOWEST_VENV:-$(mktemp -d "${TMPDIR:-/tmp}/callback-relay-lowest.XXXXXX")}"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -c constraints-lowest.txt -e '.[test]'
"$venv/bin/python" -m pip check
"$venv/bin/python" - <<'PY'
"""Refuse to run unless every pinned lower bound is what got installed."""
import sys
from importlib.metadata import version
from pathlib import Path

wrong = []
for line in Path("constraints-lowest.txt").read_text().splitlines():
    line = line.partition("#")[0].strip()
    if line:
        name, _, wanted = line.partition("==")
        if version(name) != wanted:
            wrong.append(f"{name} {version(name)} installed, not {wanted}")
sys.exit("\n".join(wrong) or None)
PY
"$venv/bin/python" -m pytest -p no:cacheprovider -q -m 'not slow' \
    tests/test_receiving.py tests/test_auth.py tests/test_platform_plugin.py \
    tests/test_destinations.py tests/test_destination_registry.py tests/test_without_brokers.py \
    tests/test_dest_amqp.py tests/test_dest_nats.py tests/test_dest_mqtt.py \
    tests/test_relay_e2e.py tests/test_listening.py tests/test_migrate.py tests/test_console.py \
    "$@"
